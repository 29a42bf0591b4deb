"""Command line interface: one subcommand per pipeline stage (`dpmerge --help`).

Every Snakemake rule calls one of these; each also works by hand on files a researcher already has.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def _log(message: str) -> None:
    print(message, flush=True)


def _json_arg(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"error: {what} is not valid JSON ({error}): {text!r}")
    if not isinstance(value, dict):
        raise SystemExit(f"error: {what} must be a JSON object, got {text!r}")
    return value


def _parse_params(pairs: list[str]) -> dict:
    params = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"error: --param expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


def backbone_from_spec(spec: dict):
    """Build a backbone from a config entry: {kind, trainable_blocks, [max_length], [image_size], [checkpoint]}."""
    from dpmerge.backbones import BACKBONES, load_backbone

    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in BACKBONES:
        raise SystemExit(f"error: unknown backbone kind {kind!r}; known: {', '.join(sorted(BACKBONES))}")
    spec.pop("image_size", None)  # used by the task loader, not by the network
    unknown = set(spec) - set(BACKBONES[kind].options)
    if unknown:
        raise SystemExit(
            f"error: backbone kind {kind!r} takes no option(s) {sorted(unknown)}; "
            f"options: {', '.join(BACKBONES[kind].options)}"
        )
    return load_backbone(kind, **spec)


def _set_threads(threads: int) -> None:
    torch.set_num_threads(max(1, threads))


# ------------------------------------------------------------------------------------------------ commands


def cmd_prepare(args) -> None:
    """Load a task, run the frozen trunk once, save features and labels."""
    from dataclasses import asdict

    from dpmerge.tasks import load_task
    from dpmerge.taskvectors import atomic_write

    _set_threads(args.threads)
    spec = _json_arg(args.backbone_spec, "--backbone-spec")
    backbone = backbone_from_spec(spec)
    started = time.time()
    data = load_task(
        args.task, image_size=int(spec.get("image_size", 64)), max_train=args.max_train or None,
        max_test=args.max_test or None, seed=args.data_seed, public_examples=args.public_examples,
    )
    if data.spec.modality != backbone.modality:
        raise SystemExit(
            f"error: task {args.task!r} is a {data.spec.modality} task but backbone {args.backbone!r} "
            f"is a {backbone.modality} backbone"
        )
    _log(f"[prepare] {args.task}: {len(data.train_labels)} train / {len(data.test_labels)} test / "
         f"{len(data.public_labels)} public examples")
    train = backbone.trunk_features(data.train_inputs)
    test = backbone.trunk_features(data.test_inputs)
    public = backbone.trunk_features(data.public_inputs) if len(data.public_labels) else ()
    payload = {
        "task": args.task,
        "backbone": args.backbone,
        "task_spec": asdict(data.spec),
        "class_names": list(data.class_names),
        "train_features": list(train),
        "train_labels": torch.as_tensor(data.train_labels, dtype=torch.long),
        "test_features": list(test),
        "test_labels": torch.as_tensor(data.test_labels, dtype=torch.long),
        # Held out of private training: free to use for merge statistics.
        "public_features": list(public),
        "public_labels": torch.as_tensor(data.public_labels, dtype=torch.long),
        "pretrained_sha256": backbone.checkpoint_sha256,
    }
    atomic_write(args.out, lambda tmp: torch.save(payload, tmp))
    _log(f"[prepare] wrote {args.out} in {time.time() - started:.1f}s")


def cmd_pretrained(args) -> None:
    """Save w0 restricted to the trainable (mergeable) parameters."""
    from dpmerge.taskvectors import save_tensors

    _set_threads(1)
    spec = _json_arg(args.backbone_spec, "--backbone-spec")
    backbone = backbone_from_spec(spec)
    save_tensors(
        args.out, backbone.top_state(),
        {"backbone": args.backbone, "spec": spec, "pretrained_sha256": backbone.checkpoint_sha256},
    )
    _log(f"[pretrained] wrote {args.out} ({len(backbone.trainable_names())} tensors)")


def cmd_finetune(args) -> None:
    from dpmerge.evaluate import load_prepared
    from dpmerge.finetune import FinetuneConfig, finetune
    from dpmerge.taskvectors import save_released

    _set_threads(args.threads)
    spec = _json_arg(args.backbone_spec, "--backbone-spec")
    hparams = _json_arg(args.hparams, "--hparams")
    prepared = load_prepared(args.data)
    backbone = backbone_from_spec(spec)
    if prepared["pretrained_sha256"] != backbone.checkpoint_sha256:
        raise SystemExit(f"error: {args.data} was prepared from different pretrained weights; rerun prepare")
    try:
        config = FinetuneConfig(
            method=args.method, target_epsilon=args.epsilon, seed=args.seed, **hparams
        )
    except TypeError as error:
        raise SystemExit(f"error: bad fine-tuning hyperparameters {sorted(hparams)}: {error}")
    result = finetune(
        backbone, prepared["task_spec"]["num_classes"], tuple(prepared["train_features"]),
        prepared["train_labels"], config, log=_log, checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
    )
    # Training losses are statistics of private data: they stay in the job log, never in a released file.
    identity = {"backbone": args.backbone, "task": prepared["task"]}
    save_released(args.out_head, result.head, result.record, {**identity, "artifact": "head"})
    save_released(args.out_vector, result.task_vector, result.record, {**identity, "artifact": "task_vector"})
    if args.checkpoint:
        Path(args.checkpoint).unlink(missing_ok=True)
    _log(f"[finetune] released {args.out_vector} (spent epsilon {result.record['spent_epsilon']})")


def _read_task_vectors(paths: list[str]) -> tuple[list[dict], list[dict]]:
    from dpmerge.taskvectors import check_privacy_record, load_tensors

    vectors, metas = [], []
    for path in paths:
        tensors, meta = load_tensors(path)
        check_privacy_record(meta, path)
        vectors.append(tensors)
        metas.append(meta)
    return vectors, metas


def _common(metas: list[dict], key: str, what: str):
    values = {json.dumps(m.get(key)) for m in metas}
    if len(values) != 1:
        raise SystemExit(f"error: {what} disagree on {key!r}: {sorted(values)}")
    return metas[0].get(key)


def cmd_merge(args) -> None:
    from dpmerge.merging import (
        NEEDS_STATISTICS, OPERATORS, SafetensorsSource, check_same_structure, is_part, is_personalized,
        merge_stream, part_bits, stored_layout,
    )
    from dpmerge.taskvectors import (
        LazySafetensors, check_privacy_record, file_tensors_sha256, read_metadata, write_tensors_streaming,
    )

    params = _parse_params(args.param)
    base = LazySafetensors(args.base)
    metas = []
    for path in args.task_vectors:
        meta = read_metadata(path)
        check_privacy_record(meta, path)
        metas.append(meta)
    for key in ("backbone", "method", "target_epsilon", "seed", "pretrained_sha256"):
        _common(metas, key, "task vectors")
    if metas[0]["pretrained_sha256"] != base.metadata.get("pretrained_sha256"):
        raise SystemExit(f"error: task vectors were trained from other pretrained weights than {args.base}")
    statistics, statistics_meta = None, None
    if args.method in NEEDS_STATISTICS:
        if not args.statistics:
            raise SystemExit(f"error: {args.method} needs --statistics (from 'dpmerge statistics --kind "
                             f"{NEEDS_STATISTICS[args.method]}')")
        statistics, statistics_meta = _statistics_source(args.statistics, NEEDS_STATISTICS[args.method], metas,
                                                         args.task_vectors)
    elif args.statistics:
        raise SystemExit(f"error: {args.method} uses no data statistics; drop --statistics")
    try:
        source = SafetensorsSource(args.task_vectors, statistics)  # every vector has the first one's tensors...
        check_same_structure([args.base, args.task_vectors[0]], [base.structure(), source.files[0].structure()])
        # Streamed end to end: w0 + merged tensor is written as soon as it is computed, so memory holds one
        # tensor per task vector (plus the operator's per-tensor temporaries), never a whole model.
        merged_model = (
            (key, merged if is_part(key) else base.get_tensor(key) + merged.to(base.dtype(key)))
            for key, merged in merge_stream(args.method, source, args.vectors, **params)
        )
        name = args.name or (args.method if args.vectors == "task" else f"{args.method}_{args.vectors}")
        hyper = {**OPERATORS[args.method].defaults, **params}  # merge_stream has refused unknown ones
        meta = {
            "artifact": "merged_model",
            "operator": args.method,
            "merge_name": name,
            "vectors": args.vectors,
            "hyperparameters": hyper,
            "backbone": metas[0]["backbone"],
            "method": metas[0]["method"],
            "target_epsilon": metas[0]["target_epsilon"],
            "seed": metas[0]["seed"],
            "pretrained_sha256": metas[0]["pretrained_sha256"],
            "tasks": [m["task"] for m in metas],
            "inputs": [{"path": p, "sha256": file_tensors_sha256(p)} for p in args.task_vectors],
            # Post-processing of releases from disjoint datasets: (max eps, max delta)-DP by parallel composition.
            "release_epsilon": max((m["spent_epsilon"] for m in metas), key=lambda e: float(e)),
            "release_delta": max(float(m["delta"]) for m in metas),
        }
        if statistics_meta is not None:
            meta["statistics"] = {"path": args.statistics, "kind": statistics_meta["kind"],
                                  "source": statistics_meta["source"], "records": statistics_meta["records"]}
            if statistics_meta["source"] == "private":
                # Each task's fine-tuning and its privatized statistic compose on that task's data.
                meta["release_epsilon"] = max((r["total_epsilon"] for r in statistics_meta["records"]),
                                              key=lambda e: float(e))
        layout = {key: (base.dtype(key), base.shape(key)) for key in source.keys()}
        if is_personalized(args.method):
            # One model per task at evaluation: the shared tensors (a loadable model) plus per-task parts.
            extra = sum(part_bits(args.method, shape, dtype, **params) for dtype, shape in layout.values())
            model = sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() * 8
                        for dtype, shape in layout.values())
            meta["personalized"] = {"extra_bits_per_task": extra, "model_bits": model,
                                    "extra_storage_per_task": extra / model}
            _log(f"[merge] {args.method}: {extra / 8 / 2**20:.2f} MiB per task beside the shared model "
                 f"({100 * extra / model:.1f} % of one model)")
        layout = stored_layout(args.method, layout, len(metas), **params)
        write_tensors_streaming(args.out, layout, merged_model, meta)
    except ValueError as error:
        raise SystemExit(f"error: {error}")  # nothing written: the output appears only complete
    _log(f"[merge] {name}: {args.method} {hyper} of {args.vectors} vectors over {len(metas)} task vectors "
         f"(streamed) -> {args.out}")


def cmd_statistics(args) -> None:
    """Per-task RegMean Grams or Fisher diagonals of a release group's task models, public or privatized."""
    import zlib

    from dpmerge.evaluate import load_prepared
    from dpmerge.merge_statistics import fisher_statistics, gram_statistics
    from dpmerge.privacy import calibrate_noise_multiplier, composed_epsilon
    from dpmerge.taskvectors import file_tensors_sha256, load_tensors, save_tensors

    _set_threads(args.threads)
    if not (len(args.task_vectors) == len(args.heads) == len(args.data)):
        raise SystemExit("error: give one --task-vectors, --heads and --data file per task, in the same order")
    if args.source == "private" and (args.clip_norm is None or args.epsilon is None):
        raise SystemExit("error: --source private needs --clip-norm and --epsilon (the statistic's own budget)")
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    vectors, metas = _read_task_vectors(args.task_vectors)
    tensors, records = {}, []
    for index, (vector, meta, head_path, data_path) in enumerate(zip(vectors, metas, args.heads, args.data)):
        prepared = load_prepared(data_path)
        if prepared["task"] != meta["task"]:
            raise SystemExit(f"error: {data_path} holds task {prepared['task']!r}, {args.task_vectors[index]} "
                             f"was trained on {meta['task']!r}")
        if args.source == "public":
            features, available = prepared["public_features"], len(prepared["public_labels"])
            if available == 0:
                raise SystemExit(f"error: {data_path} holds no public examples; set data.public_examples > 0 "
                                 "(examples held out of private training) or use private statistics")
        else:
            features, available = prepared["train_features"], len(prepared["train_labels"])
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + zlib.crc32(meta["task"].encode()))
        chosen = torch.randperm(available, generator=generator)[: min(args.examples, available)].sort().values
        features = tuple(f[chosen] for f in features)
        record = {"task": meta["task"], "source": args.source, "examples": int(len(chosen)),
                  "task_vector_sha256": file_tensors_sha256(args.task_vectors[index])}
        clip_norm, sigma = None, 0.0
        if args.source == "private":
            clip_norm = args.clip_norm
            if meta["method"] == "nonprivate":
                record.update(clip_norm=clip_norm, noise_multiplier=0.0, statistic_epsilon="inf",
                              total_epsilon="inf")
            else:
                delta, accountant = float(meta["delta"]), meta["accountant"]
                sigma = calibrate_noise_multiplier(args.epsilon, delta, 1.0, 1, 1, accountant)
                finetuning = (float(meta["effective_noise_multiplier"]), float(meta["sample_rate"]), int(meta["steps"]))
                total = composed_epsilon([finetuning, (sigma, 1.0, 1)], delta, accountant)
                record.update(clip_norm=clip_norm, noise_multiplier=sigma, statistic_epsilon=args.epsilon,
                              finetune_spent_epsilon=meta["spent_epsilon"], total_epsilon=total, delta=delta,
                              accountant=accountant)
        backbone.load_top_state({name: base[name] + vector[name] for name in base})
        if args.kind == "gram":
            result = gram_statistics(backbone, features, clip_norm, sigma, generator)
        else:
            head, _ = load_tensors(head_path)
            result = fisher_statistics(backbone, head, features, clip_norm, sigma, generator)
        tensors.update({f"{index}/{key}": value for key, value in result.items()})
        records.append(record)
        _log(f"[statistics] {args.kind} of {meta['task']} on {len(chosen)} {args.source} examples"
             + (f", sigma {sigma:.3f}, total epsilon {record['total_epsilon']}" if sigma else ""))
    meta = {"artifact": "merge_statistics", "kind": args.kind, "source": args.source,
            "tasks": [m["task"] for m in metas], "records": records, **_identity(metas[0]),
            "pretrained_sha256": metas[0]["pretrained_sha256"]}
    save_tensors(args.out, tensors, meta)
    _log(f"[statistics] wrote {args.out}")


def _statistics_source(path: str, kind: str, metas: list[dict], vector_paths: list[str]):
    """The per-task statistics of a `dpmerge statistics` file, checked against the vectors being merged."""
    from dpmerge.merging import StatisticsSource
    from dpmerge.taskvectors import LazySafetensors, file_tensors_sha256

    file = LazySafetensors(path)
    meta = file.metadata
    if meta.get("artifact") != "merge_statistics" or meta.get("kind") != kind:
        raise SystemExit(f"error: {path} is not a {kind} statistics file (from 'dpmerge statistics --kind {kind}')")
    if meta["tasks"] != [m["task"] for m in metas]:
        raise SystemExit(f"error: {path} covers tasks {meta['tasks']}, the vectors are {[m['task'] for m in metas]}")
    for record, vector_path in zip(meta["records"], vector_paths):
        if record["task_vector_sha256"] != file_tensors_sha256(vector_path):
            raise SystemExit(f"error: {path} was computed from another task vector than {vector_path}")

    class Prefixed:
        def __init__(self, index):
            self.prefix = f"{index}/"

        def keys(self):
            return [k.removeprefix(self.prefix) for k in file.keys() if k.startswith(self.prefix)]

        def get_tensor(self, key):
            return file.get_tensor(self.prefix + key)

    return StatisticsSource([Prefixed(i) for i in range(len(metas))],
                            [f"{path} (task {task})" for task in meta["tasks"]]), meta


def _load_heads_and_data(heads: list[str], data: list[str]):
    from dpmerge.evaluate import load_prepared
    from dpmerge.taskvectors import load_tensors

    if len(heads) != len(data):
        raise SystemExit(f"error: {len(heads)} --heads but {len(data)} --data files; give one head per task")
    out = []
    for head_path, data_path in zip(heads, data):
        head, meta = load_tensors(head_path)
        prepared = load_prepared(data_path)
        if meta.get("task") != prepared["task"]:
            raise SystemExit(f"error: head {head_path} is for task {meta.get('task')!r}, data {data_path} for {prepared['task']!r}")
        out.append((head, meta, prepared))
    return out


def _write_parquet(rows: list[dict], out: str) -> None:
    import pandas as pd

    from dpmerge.taskvectors import atomic_write

    atomic_write(out, lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False))


def _identity(meta: dict) -> dict:
    return {
        "backbone": meta.get("backbone"),
        "method": meta.get("method"),
        "target_epsilon": str(meta.get("target_epsilon")),
        "seed": meta.get("seed"),
    }


def cmd_evaluate(args) -> None:
    from dpmerge.evaluate import evaluate_head
    from dpmerge.taskvectors import load_tensors

    _set_threads(args.threads)
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    tasks = _load_heads_and_data(args.heads, args.data)
    rows = []

    def score_all_tasks(model_label: str, source_task: str) -> None:
        for head, meta, prepared in tasks:
            result = evaluate_head(
                backbone, head, tuple(prepared["test_features"]), prepared["test_labels"],
                prepared["task_spec"]["metric"],
            )
            rows.append({**_identity(meta), "model": model_label, "source_task": source_task,
                         "task": prepared["task"], **result})
            _log(f"[evaluate] {model_label} ({source_task}) on {prepared['task']}: "
                 f"{result['metric']}={result['score']:.2f} loss={result['loss']:.4f}")

    if args.merged:
        from dpmerge.merging import is_part, is_personalized, personal_vector

        merged, merged_meta = load_tensors(args.merged)
        label = merged_meta.get("merge_name", merged_meta["operator"])
        if is_personalized(merged_meta["operator"]):
            # Task t is served by its own model w0 + reconstruct(shared, parts of t) (the task is known at test
            # time, as EMR, TALL masks and DTS assume); each model is scored on its own task only.
            shared = {k: v - base[k] for k, v in merged.items() if not is_part(k)}
            parts = {k: v for k, v in merged.items() if is_part(k)}
            order = merged_meta["tasks"]
            for head, meta, prepared in tasks:
                vector = personal_vector(merged_meta["operator"], shared, parts, order.index(prepared["task"]),
                                         **merged_meta["hyperparameters"])
                backbone.load_top_state({name: base[name] + vector[name] for name in base})
                result = evaluate_head(backbone, head, tuple(prepared["test_features"]), prepared["test_labels"],
                                       prepared["task_spec"]["metric"])
                rows.append({**_identity(meta), "model": label, "source_task": "merged", "task": prepared["task"],
                             **result})
                _log(f"[evaluate] {label} (own model) on {prepared['task']}: "
                     f"{result['metric']}={result['score']:.2f} loss={result['loss']:.4f}")
        else:
            backbone.load_top_state(merged)
            score_all_tasks(label, "merged")
    else:
        if len(args.task_vectors or []) != len(tasks):
            raise SystemExit("error: individual evaluation needs one --task-vectors file per --heads file")
        vectors, metas = _read_task_vectors(args.task_vectors)
        # Every task model on every task (with that task's head): the diagonal is the "DP Individual" score,
        # the off-diagonal shows how far one task's encoder serves the others.
        for vector, meta in zip(vectors, metas):
            backbone.load_top_state({name: base[name] + vector[name] for name in base})
            score_all_tasks("individual", meta["task"])
    _write_parquet(rows, args.out)


def cmd_drift(args) -> None:
    from dpmerge.diagnostics import reference_drift
    from dpmerge.taskvectors import load_tensors

    base, _ = load_tensors(args.base)
    vectors, metas = _read_task_vectors(args.task_vectors)
    mean, per_task = reference_drift(base, vectors)
    rows = [{**_identity(m), "task": m["task"], "drift": d, "mean_drift": mean} for m, d in zip(metas, per_task)]
    _write_parquet(rows, args.out)
    _log(f"[drift] mean reference drift {mean:.6f}")


def _test_subsample(prepared: dict, max_examples: int):
    """(features, labels) of a fixed, seeded test subsample: a diagnostic's cost stays predictable and every
    diagnostic and model sees the same examples."""
    n = min(max_examples, int(prepared["test_labels"].shape[0]))
    pick = torch.randperm(prepared["test_labels"].shape[0], generator=torch.Generator().manual_seed(0))[:n]
    return tuple(f[pick] for f in prepared["test_features"]), prepared["test_labels"][pick]


def cmd_interpolate(args) -> None:
    import numpy as np

    from dpmerge.diagnostics import barrier_height, interpolation_curve
    from dpmerge.taskvectors import load_tensors

    _set_threads(args.threads)
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    merged, merged_meta = load_tensors(args.merged)
    merged_vector = {name: merged[name] - base[name] for name in base}
    vectors, _ = _read_task_vectors(args.task_vectors)
    tasks = _load_heads_and_data(args.heads, args.data)
    gammas = np.linspace(0.0, 1.0, args.points)
    rows = []
    for vector, (head, meta, prepared) in zip(vectors, tasks):
        features, labels = _test_subsample(prepared, args.max_examples)
        n = int(labels.shape[0])
        curve = interpolation_curve(
            backbone, base, vector, merged_vector, head, features, labels,
            prepared["task_spec"]["metric"], gammas,
        )
        barrier = barrier_height(gammas, np.array([r["loss"] for r in curve]))
        for point in curve:
            rows.append({**_identity(meta), "operator": merged_meta.get("merge_name", merged_meta["operator"]),
                         "task": prepared["task"], **point, "barrier": barrier, "num_examples": n})
        _log(f"[interpolate] {prepared['task']}: barrier {barrier:.4f}")
    _write_parquet(rows, args.out)


def cmd_curvature(args) -> None:
    from dpmerge.diagnostics import merge_gap_bound, sharpness_proxy, task_loss
    from dpmerge.taskvectors import load_tensors

    _set_threads(args.threads)
    if not args.rho > 0:
        raise SystemExit(f"error: --rho must be > 0, got {args.rho}")
    if args.iterations < 1 or args.max_examples < 1:
        raise SystemExit(f"error: --iterations and --max-examples must be >= 1, got {args.iterations}, "
                         f"{args.max_examples}")
    if not args.gammas or any(not 0 <= g <= 1 for g in args.gammas) or args.gammas[0] != 0:
        raise SystemExit(f"error: --gammas must start at 0 and lie in [0, 1], got {args.gammas}")
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    merged, merged_meta = load_tensors(args.merged)
    vectors, _ = _read_task_vectors(args.task_vectors)
    tasks = _load_heads_and_data(args.heads, args.data)
    rows = []
    for vector, (head, meta, prepared) in zip(vectors, tasks):
        features, labels = _test_subsample(prepared, args.max_examples)
        n = int(labels.shape[0])
        loss = task_loss(backbone, head, features, labels)
        task_params = {name: base[name] + vector[name] for name in base}
        merged_params = {name: merged[name] for name in base}
        sharpness = sharpness_proxy(loss, task_params, args.rho)
        gap = merge_gap_bound(loss, task_params, merged_params, args.gammas, args.iterations, args.tolerance,
                              seed=0)
        rows.append({**_identity(meta), "operator": merged_meta.get("merge_name", merged_meta["operator"]),
                     "task": prepared["task"], "rho": args.rho, "sharpness": sharpness, **gap,
                     "gammas": json.dumps(list(args.gammas)), "iterations": args.iterations, "num_examples": n})
        _log(f"[curvature] {prepared['task']}: sharpness {sharpness:.4g}, lambda_max {gap['lambda_max_at_task']:.4g}, "
             f"merge gap {gap['merge_gap']:.4g} <= bound {gap['bound']:.4g}")
    _write_parquet(rows, args.out)


def cmd_table(args) -> None:
    import pandas as pd

    from dpmerge.tables import table1, write_table

    frames = [pd.read_parquet(p) for p in args.scores]
    scores = pd.concat(frames, ignore_index=True)
    table = table1(scores)
    for path in write_table(table, args.out_prefix, args.caption):
        _log(f"[table] wrote {path}")


def cmd_plot_interpolation(args) -> None:
    import pandas as pd

    from dpmerge.tables import plot_interpolation

    curves = pd.concat([pd.read_parquet(p) for p in args.curves], ignore_index=True)
    for out in args.out:
        plot_interpolation(curves, out, args.title)
        _log(f"[figure] wrote {out}")


def cmd_ledger(args) -> None:
    from dpmerge.privacy_ledger import (
        build_ledger, build_statistics_ledger, check_ledger, check_statistics, ledger_report,
    )
    from dpmerge.taskvectors import atomic_write

    ledger = build_ledger(args.task_vectors)
    statistics = build_statistics_ledger(args.statistics or [])
    problems = check_ledger(ledger) + check_statistics(statistics, ledger)
    atomic_write(args.out, lambda tmp: ledger.to_parquet(tmp, index=False))
    if args.statistics_out:
        atomic_write(args.statistics_out, lambda tmp: statistics.to_parquet(tmp, index=False))
    atomic_write(args.report, lambda tmp: Path(tmp).write_text(ledger_report(ledger, problems, statistics)))
    if problems:
        raise SystemExit("error: privacy ledger check failed:\n  " + "\n  ".join(problems))
    _log(f"[ledger] {len(ledger)} released task vectors, all within budget")


# ---------------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    from dpmerge.merging import OPERATORS

    parser = argparse.ArgumentParser(
        prog="dpmerge",
        description="Differentially private fine-tuning, task vectors and data-free merging (DP-Merging).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    spec_help = 'backbone config entry as JSON, e.g. \'{"kind": "efficientnet_lite0", "trainable_blocks": 1}\''

    p = add("prepare", cmd_prepare, "Load a task and cache the frozen trunk's features for it.")
    p.add_argument("--backbone", required=True, help="backbone name (as in the config)")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--task", required=True, help="task name (see dpmerge.tasks.TASKS)")
    p.add_argument("--max-train", type=int, default=None, help="cap on training examples (seeded subset; 0 = no cap)")
    p.add_argument("--max-test", type=int, default=None, help="cap on test examples (seeded subset; 0 = no cap)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the seeded subsets (the train/test split itself is fixed per task)")
    p.add_argument("--public-examples", type=int, default=0,
                   help="training examples held out of private training as public data for merge statistics")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, help="output .pt file")

    p = add("pretrained", cmd_pretrained, "Save the pretrained weights w0 of the trainable (merged) parameters.")
    p.add_argument("--backbone", required=True)
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--out", required=True, help="output .safetensors")

    p = add("finetune", cmd_finetune, "Fine-tune one task privately and release its task vector and head.")
    p.add_argument("--backbone", required=True)
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--data", required=True, help="prepared task file from 'dpmerge prepare'")
    p.add_argument("--method", required=True, help="nonprivate, naive_dp, dp_merging, dp_sam or dp_anchor")
    p.add_argument("--epsilon", type=float, default=None, help="target epsilon (delta = 1/N)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hparams", default="{}", help="JSON of FinetuneConfig fields (epochs, batch_size, lr, ...)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-vector", required=True, help="task vector .safetensors")
    p.add_argument("--out-head", required=True, help="task head .safetensors")
    p.add_argument("--checkpoint", help="resumable state file, kept outside the outputs (removed when done)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")

    ops = "; ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in op.defaults.items()) or 'no hyperparameters'})"
                    for name, op in OPERATORS.items())
    p = add("merge", cmd_merge, f"Merge released task vectors. Operators (hyperparameter=default): {ops}.")
    p.add_argument("task_vectors", nargs="+", help="task vector .safetensors files")
    p.add_argument("--method", required=True, help="merge operator name (listed above)")
    p.add_argument("--vectors", choices=["task", "difference"], default="task",
                   help="merge the task vectors tau_t, or the difference vectors tau_t - mean(tau) around the "
                        "weight average (the result is then the average plus the merged differences)")
    p.add_argument("--name", help="label of this merge in scores and tables (default: the method, with "
                                  "'_difference' appended for difference vectors)")
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors (from 'dpmerge pretrained')")
    p.add_argument("--param", action="append", help="operator hyperparameter key=value (repeatable)")
    p.add_argument("-o", "--out", required=True, help="merged model .safetensors")

    p.add_argument("--statistics", help="per-task data statistics for regmean / fisher (from 'dpmerge statistics')")

    p = add("statistics", cmd_statistics,
            "Per-task RegMean Gram matrices or Fisher diagonals of a release group's task models, on public data "
            "(held out of private training, free) or on private training data (clipped, noised, and composed "
            "with each task's fine-tuning budget; the total is recorded).")
    p.add_argument("--kind", required=True, choices=["gram", "fisher"])
    p.add_argument("--source", required=True, choices=["public", "private"])
    p.add_argument("--examples", type=int, default=256, help="examples per task (seeded subsample)")
    p.add_argument("--clip-norm", type=float, help="private: L2 bound of each example's whole contribution")
    p.add_argument("--epsilon", type=float, help="private: the statistic's own epsilon at the task's delta")
    p.add_argument("--seed", type=int, default=0, help="seed of the subsample and the noise")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--task-vectors", nargs="+", required=True)
    p.add_argument("--heads", nargs="+", required=True)
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, one per task vector")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-o", "--out", required=True, help="statistics .safetensors")

    p = add("evaluate", cmd_evaluate, "Score every individual (w0 + tau_t) or merged model on every task's test set.")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--merged", help="merged model .safetensors (omit to evaluate the individual task vectors)")
    p.add_argument("--task-vectors", nargs="*", help="task vectors, one per task (individual evaluation)")
    p.add_argument("--heads", nargs="+", required=True, help="task heads, one per task")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order as --heads")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-o", "--out", required=True, help="output .parquet")

    p = add("drift", cmd_drift, "Reference drift ||w_t - w0|| / ||w0|| per task vector (paper Fig. 3b).")
    p.add_argument("--base", required=True)
    p.add_argument("--task-vectors", nargs="+", required=True)
    p.add_argument("-o", "--out", required=True)

    p = add("curvature", cmd_curvature,
            "Per task: sharpness proxy, Hessian lambda_max (power iteration), merge gap and Theorem 5.2's bound.")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained top weights (safetensors)")
    p.add_argument("--merged", required=True, help="merged model (safetensors) the gap is measured to")
    p.add_argument("--task-vectors", nargs="+", required=True)
    p.add_argument("--heads", nargs="+", required=True, help="one head per task vector, same order")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order")
    p.add_argument("--rho", type=float, default=0.05, help="sharpness radius (default 0.05)")
    p.add_argument("--iterations", type=int, default=20, help="power iterations per lambda_max (default 20)")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="stop a power iteration when lambda changes by less than this, relatively (default 1e-3)")
    p.add_argument("--gammas", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                   help="points of the segment w_t -> w_merge where lambda_max is measured for beta_t "
                        "(first must be 0; default 0 0.5 1)")
    p.add_argument("--max-examples", type=int, default=64, help="seeded test subsample per task (default 64)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-o", "--out", required=True, help="output Parquet, one row per task")

    p = add("interpolate", cmd_interpolate, "Loss along (1-gamma) w_t + gamma w_merge per task (paper Fig. 2).")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--base", required=True)
    p.add_argument("--merged", required=True)
    p.add_argument("--task-vectors", nargs="+", required=True)
    p.add_argument("--heads", nargs="+", required=True)
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--points", type=int, default=11, help="number of gamma values in [0, 1]")
    p.add_argument("--max-examples", type=int, default=200, help="seeded test subsample per task")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-o", "--out", required=True)

    p = add("table", cmd_table, "Table-1-shaped table (Parquet, Markdown, LaTeX) from evaluation files.")
    p.add_argument("scores", nargs="+", help="evaluation .parquet files")
    p.add_argument("--caption", default="")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet, PREFIX.md, PREFIX.tex")

    p = add("plot-interpolation", cmd_plot_interpolation, "Figure of interpolation curves per task and method.")
    p.add_argument("curves", nargs="+", help="interpolation .parquet files")
    p.add_argument("--title", default="")
    p.add_argument("-o", "--out", nargs="+", required=True, help="output image(s): .png and/or .pdf")

    p = add("ledger", cmd_ledger, "Collect and check the privacy records of all released task vectors.")
    p.add_argument("task_vectors", nargs="+")
    p.add_argument("-o", "--out", required=True, help="ledger .parquet")
    p.add_argument("--report", required=True, help="ledger check report .md")
    p.add_argument("--statistics", nargs="*", help="merge statistics files (from 'dpmerge statistics')")
    p.add_argument("--statistics-out", help="per-task ledger of merge statistics .parquet")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
