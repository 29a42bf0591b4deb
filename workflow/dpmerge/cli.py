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


STUDY_KEY_HELP = ("the study's secret key file (created with mode 0600 if missing; the workflow keeps it at "
                  "<results>/private/study.key): it keys every random draw, so keep it private and back it up")

# Where and how a backbone runs (config `compute:`), carried in the backbone spec so every rule sees the same.
RUN_SETTINGS = ("device", "precision")


def backbone_from_spec(spec: dict):
    """Build a backbone from a config entry: {kind, trainable_blocks, [max_length], [image_size], [checkpoint],
    [device], [precision], ...} (BACKBONES[kind].options lists each kind's fields)."""
    from dpmerge.backbones import BACKBONES, load_backbone

    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in BACKBONES:
        raise SystemExit(f"error: unknown backbone kind {kind!r}; known: {', '.join(sorted(BACKBONES))}")
    run = {key: spec.pop(key) for key in RUN_SETTINGS if key in spec}
    spec.pop("image_size", None)  # used by the task loader, not by the network
    unknown = set(spec) - set(BACKBONES[kind].options)
    if unknown:
        raise SystemExit(
            f"error: backbone kind {kind!r} takes no option(s) {sorted(unknown)}; "
            f"options: {', '.join(BACKBONES[kind].options)}"
        )
    try:
        # CPU unless the spec says otherwise: the workflow leaves the defaults out of the spec
        return load_backbone(kind, **spec).set_device(**{"device": "cpu", "precision": "fp32", **run})
    except ValueError as error:
        raise SystemExit(f"error: backbone {kind!r}: {error}")


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
    from dpmerge.paper_data import MissingDataError

    try:
        data = load_task(
            args.task, image_size=int(spec.get("image_size", 64)), max_train=args.max_train or None,
            max_test=args.max_test or None, seed=args.data_seed, data_dir=args.data_dir, workers=args.workers,
        )
    except (MissingDataError, ValueError) as error:
        raise SystemExit(f"error: {error}")
    if data.spec.modality != backbone.modality:
        raise SystemExit(
            f"error: task {args.task!r} is a {data.spec.modality} task but backbone {args.backbone!r} "
            f"is a {backbone.modality} backbone"
        )
    _log(f"[prepare] {args.task}: {len(data.train_labels)} train / {len(data.test_labels)} test examples")
    train = backbone.trunk_features(data.train_inputs, log=_log)
    test = backbone.trunk_features(data.test_inputs)
    payload = {
        "task": args.task,
        "backbone": args.backbone,
        "task_spec": asdict(data.spec),
        "class_names": list(data.class_names),
        "train_features": list(train),
        # int64 class indices, or float32 scores for a regression task (STS-B)
        "train_labels": torch.as_tensor(data.train_labels),
        "test_features": list(test),
        "test_labels": torch.as_tensor(data.test_labels),
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
    weights_spec = {key: value for key, value in spec.items() if key not in RUN_SETTINGS}
    save_tensors(
        args.out, backbone.top_state(),
        {"backbone": args.backbone, "spec": weights_spec, "pretrained_sha256": backbone.checkpoint_sha256},
    )
    _log(f"[pretrained] wrote {args.out} ({len(backbone.trainable_names())} tensors)")


def cmd_zeroshot_head(args) -> None:
    """A CLIP zero-shot classification head for one task from the text encoder, class names and prompts."""
    from dpmerge.evaluate import load_prepared
    from dpmerge.taskvectors import save_tensors
    from dpmerge.zeroshot_prompts import TEMPLATES

    _set_threads(args.threads)
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    if not hasattr(backbone, "zeroshot_head"):
        raise SystemExit(f"error: backbone {args.backbone!r} has no text encoder for zero-shot heads")
    prepared = load_prepared(args.data)
    task = prepared["task"]
    # The paper's tasks use task_vectors' prompts; any other task the generic CLIP prompt.
    templates = TEMPLATES.get(task, [lambda c: f"a photo of a {c}."])
    head = backbone.zeroshot_head(list(prepared["class_names"]), templates)
    save_tensors(args.out, head, {
        "artifact": "zeroshot_head", "backbone": args.backbone, "task": task,
        "pretrained_sha256": backbone.checkpoint_sha256, "class_names": list(prepared["class_names"]),
        "templates": [template("{}") for template in templates],
        # computed from public weights and public class names: no private data, no privacy cost
        "privacy": "public",
    })
    _log(f"[zeroshot-head] {task}: {len(prepared['class_names'])} classes x {len(templates)} prompts -> {args.out}")


def cmd_prepare_data(args) -> None:
    """Download one paper dataset into the data directory (online machines only)."""
    from dpmerge.paper_data import download

    try:
        path = download(args.task, args.data_dir)
    except (ValueError, RuntimeError) as error:  # unknown task; offline, or a source that needs a manual copy
        raise SystemExit(f"error: {error}")
    _log(f"[prepare-data] {args.task} is in {path}")


def cmd_make_standins(args) -> None:
    """Tiny CLIP and RoBERTa checkpoints and tiny copies of the paper's datasets, in the real formats."""
    from dpmerge.paper_data import GLUE_TASKS, VISION_TASKS, standin_tokenizer_corpus, write_standin
    from dpmerge.standins import write_tiny_clip, write_tiny_roberta

    out = Path(args.out)
    config, checkpoint = write_tiny_clip(out / "clip", seed=args.seed)
    _log(f"[make-standins] tiny CLIP: {config}, {checkpoint}")
    for task in VISION_TASKS:
        write_standin(task, out / "data", num_classes=args.vision_classes, train_per_class=args.train_per_class,
                      test_per_class=args.test_per_class, image_size=args.image_size, seed=args.seed)
    for task in GLUE_TASKS:
        write_standin(task, out / "data", train_per_class=args.train_per_class, test_per_class=args.test_per_class,
                      seed=args.seed)
    write_tiny_roberta(out / "roberta", standin_tokenizer_corpus(), seed=args.seed)
    _log(f"[make-standins] tiny RoBERTa: {out / 'roberta'}; datasets: {out / 'data'}")


def cmd_finetune(args) -> None:
    from dpmerge.backbones import BACKBONES
    from dpmerge.evaluate import load_prepared
    from dpmerge.finetune import FinetuneConfig, finetune
    from dpmerge.methods import parse_label
    from dpmerge.study_key import StudyKeyError, load_or_create_key
    from dpmerge.taskvectors import load_tensors, save_released

    _set_threads(args.threads)
    spec = _json_arg(args.backbone_spec, "--backbone-spec")
    hparams = _json_arg(args.hparams, "--hparams")
    try:
        method, swept = parse_label(args.method)
    except ValueError as error:
        raise SystemExit(f"error: --method: {error}")
    for parameter, value in swept.items():
        # A sweep's label and the settings it ran with must agree, or its tables would file it under a wrong value
        if parameter not in hparams or float(hparams[parameter]) != value:
            raise SystemExit(f"error: --method {args.method} says {parameter} = {value:g}, but --hparams gives "
                             f"{hparams.get(parameter, 'no value')}")
    prepared = load_prepared(args.data)
    backbone = backbone_from_spec(spec)
    if prepared["pretrained_sha256"] != backbone.checkpoint_sha256:
        raise SystemExit(f"error: {args.data} was prepared from different pretrained weights; rerun prepare")
    try:
        config = FinetuneConfig(method=method, target_epsilon=args.epsilon, seed=args.seed, **hparams)
    except TypeError as error:
        raise SystemExit(f"error: bad fine-tuning hyperparameters {sorted(hparams)}: {error}")
    head = None
    if args.zeroshot_head:
        head, head_meta = load_tensors(args.zeroshot_head)
        if head_meta.get("pretrained_sha256") != backbone.checkpoint_sha256 or head_meta.get("task") != prepared["task"]:
            raise SystemExit(f"error: {args.zeroshot_head} is the zero-shot head of {head_meta.get('task')!r} from "
                             "other pretrained weights or another task; rerun zeroshot-head")
    elif BACKBONES[spec["kind"]].zeroshot_heads:
        raise SystemExit(f"error: backbone {args.backbone!r} classifies with frozen zero-shot heads: pass "
                         "--zeroshot-head (from 'dpmerge zeroshot-head')")
    try:
        study_key = load_or_create_key(args.study_key)
    except StudyKeyError as error:
        raise SystemExit(f"error: --study-key: {error}")
    result = finetune(
        backbone, prepared["task_spec"]["num_classes"], tuple(prepared["train_features"]),
        prepared["train_labels"], config, study_key=study_key,
        identity={"backbone": args.backbone, "task": prepared["task"], "method": args.method}, log=_log,
        checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, head=head, train_head=head is None,
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
    from dpmerge.evaluate import load_prepared
    from dpmerge.merge_statistics import fisher_statistics, gram_statistics, private_sample
    from dpmerge.study_key import StudyKeyError, load_or_create_key
    from dpmerge.taskvectors import file_tensors_sha256, load_tensors, save_tensors

    _set_threads(args.threads)
    if not (len(args.task_vectors) == len(args.heads) == len(args.data)):
        raise SystemExit("error: give one --task-vectors, --heads and --data file per task, in the same order")
    if args.source == "private" and (args.clip_norm is None or args.epsilon is None or args.study_key is None):
        raise SystemExit("error: --source private needs --clip-norm, --epsilon (the statistic's own budget) and "
                         "--study-key (its sampler and noise are keyed by the study's secret key)")
    if args.source == "public" and not args.public_data:
        raise SystemExit("error: --source public needs --public-data: the prepared file ('dpmerge prepare') of a "
                         "dataset declared public, outside every private training set")
    if args.source == "private" and args.public_data:
        raise SystemExit("error: --public-data is read only with --source public")
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    vectors, metas = _read_task_vectors(args.task_vectors)
    study_key = None
    if args.source == "private":
        try:
            study_key = load_or_create_key(args.study_key)
        except StudyKeyError as error:
            raise SystemExit(f"error: --study-key: {error}")
    public = None
    if args.source == "public":
        public = load_prepared(args.public_data)
        if public["task"] in [m["task"] for m in metas]:
            raise SystemExit(f"error: {args.public_data} holds {public['task']!r}, a private task of this release "
                             "group: a private training set is never public data")
        if public["pretrained_sha256"] != backbone.checkpoint_sha256:
            raise SystemExit(f"error: {args.public_data} was prepared from other pretrained weights; rerun prepare")
    tensors, records = {}, []
    for index, (vector, meta, head_path, data_path) in enumerate(zip(vectors, metas, args.heads, args.data)):
        prepared = load_prepared(data_path)
        if prepared["task"] != meta["task"]:
            raise SystemExit(f"error: {data_path} holds task {prepared['task']!r}, {args.task_vectors[index]} "
                             f"was trained on {meta['task']!r}")
        record = {"task": meta["task"], "source": args.source,
                  "task_vector_sha256": file_tensors_sha256(args.task_vectors[index])}
        clip_norm, sigma, noise = None, 0.0, None
        if public is not None:
            # Public data needs no secret randomness: a fixed subset, the same for every task and run.
            available = len(public["train_labels"])
            chosen = torch.randperm(available, generator=torch.Generator().manual_seed(0))[:args.examples]
            features, normaliser = tuple(f[chosen.sort().values] for f in public["train_features"]), len(chosen)
            record.update(public_dataset=public["task"], examples=int(len(chosen)))
        else:
            # Private data: a secret Poisson sample, each example's whole contribution clipped to C, Gaussian
            # noise, a mean over the expected count; accounted and composed (merge_statistics.private_sample).
            drawn = private_sample(args.kind, meta, record["task_vector_sha256"], len(prepared["train_labels"]),
                                   args.examples, args.clip_norm, args.epsilon, study_key)
            features = tuple(f[drawn.indices] for f in prepared["train_features"])
            clip_norm, sigma, noise, normaliser = args.clip_norm, drawn.noise_multiplier, drawn.noise, drawn.normaliser
            record.update(drawn.record)
        backbone.load_top_state({name: base[name] + vector[name] for name in base})
        if args.kind == "gram":
            result = gram_statistics(backbone, features, clip_norm, sigma, noise, normaliser=normaliser)
        else:
            head, _ = load_tensors(head_path)
            result = fisher_statistics(backbone, head, features, clip_norm, sigma, noise, normaliser=normaliser)
        # Statistics of the network's layers, under the names the task vectors are released with.
        result = backbone.release_statistics(args.kind, result)
        tensors.update({f"{index}/{key}": value for key, value in result.items()})
        records.append(record)
        source = f"public {public['task']}" if public is not None else "private (Poisson-sampled)"
        count = len(features[0]) if public is not None else f"~{args.examples} (expected)"
        _log(f"[statistics] {args.kind} of {meta['task']} on {count} {source} examples"
             + (f", sigma {sigma:.3f}, total epsilon {record['total_epsilon']:.4f}" if sigma else ""))
    meta = {"artifact": "merge_statistics", "kind": args.kind, "source": args.source,
            "tasks": [m["task"] for m in metas], "records": records, **_identity(metas[0]),
            "pretrained_sha256": metas[0]["pretrained_sha256"]}
    if public is not None:
        meta["public_dataset"] = public["task"]
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
        # The sensitivity tables (6, 7) tell DP-Merging runs apart by these
        "rho": float(meta.get("rho", 0.0)),
        "anchor_lambda": float(meta.get("anchor_lambda", 0.0)),
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
                     "task": prepared["task"], "sharpness_rho": args.rho, "sharpness": sharpness, **gap,
                     "gammas": json.dumps(list(args.gammas)), "iterations": args.iterations, "num_examples": n})
        _log(f"[curvature] {prepared['task']}: sharpness {sharpness:.4g}, lambda_max {gap['lambda_max_at_task']:.4g}, "
             f"merge gap {gap['merge_gap']:.4g} <= bound {gap['bound']:.4g}")
    _write_parquet(rows, args.out)


def cmd_landscape(args) -> None:
    """The 2-D loss landscape of a merged model (paper App. B.4, Figs. 4, 5): every task's test loss and their
    mean on the plane w_merge + a d1 + b d2, each task scored with its own head on a seeded test subsample."""
    import math

    import numpy as np

    from dpmerge.diagnostics import filter_normalized_direction, loss_landscape, task_loss, task_vector_plane
    from dpmerge.taskvectors import load_tensors

    _set_threads(args.threads)
    if args.points < 3:
        raise SystemExit(f"error: --points must be >= 3 (the merged model and both sides of it), got {args.points}")
    if not (args.span > 0 and math.isfinite(args.span)):
        raise SystemExit(f"error: --span must be a finite number > 0, got {args.span}")
    if args.max_examples < 1:
        raise SystemExit(f"error: --max-examples must be >= 1, got {args.max_examples}")
    if args.plane == "task_vectors" and len(args.task_vectors or []) < 2:
        raise SystemExit(f"error: --plane task_vectors needs at least two --task-vectors (the first two span the "
                         f"plane), got {len(args.task_vectors or [])}")
    started = time.time()
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    merged, merged_meta = load_tensors(args.merged)
    if missing := sorted(set(base) - set(merged)):
        raise SystemExit(f"error: --merged {args.merged} lacks tensors of --base: {missing[:3]}")
    centre = {name: merged[name] for name in base}
    operator = merged_meta.get("merge_name", merged_meta["operator"])
    tasks = _load_heads_and_data(args.heads, args.data)
    losses, examples = {}, {}
    for head, _, prepared in tasks:
        if prepared["task"] in losses:
            raise SystemExit(f"error: task {prepared['task']!r} is given twice in --heads/--data")
        features, labels = _test_subsample(prepared, args.max_examples)
        losses[prepared["task"]] = task_loss(backbone, head, features, labels)
        examples[prepared["task"]] = int(labels.shape[0])
    if args.plane == "random":
        d1, d2 = (filter_normalized_direction(centre, seed) for seed in (args.seed, args.seed + 1))
        spanned_by = (f"random (seed {args.seed})", f"random (seed {args.seed + 1})")
    else:
        vectors, metas = _read_task_vectors(args.task_vectors[:2])
        d1, d2 = task_vector_plane(*vectors)
        spanned_by = (metas[0]["task"], metas[1]["task"])
    # linspace(-span, span, points) written so that the centre is exactly 0 for odd points: the grid then holds
    # the merged model itself, not a point a rounding error away from it
    half = (args.points - 1) / 2
    coordinates = args.span * (np.arange(args.points) - half) / half
    _log(f"[landscape] {operator}: {args.plane} plane ({spanned_by[0]}, {spanned_by[1]}), {args.points}x{args.points} "
         f"points in [-{args.span:g}, {args.span:g}]^2, {len(losses)} tasks, {max(examples.values())} examples max")
    grid = loss_landscape(losses, centre, d1, d2, coordinates, coordinates,
                          log=lambda line: _log(f"[landscape] {line}"))
    identity = {**_identity(tasks[0][1]), "operator": operator, "plane": args.plane, "span": args.span,
                "direction_1": spanned_by[0], "direction_2": spanned_by[1]}
    # The mean row averages the tasks, so the examples behind it are all of theirs
    rows = [{**identity, **row, "num_examples": examples.get(row["task"], sum(examples.values()))} for row in grid]
    _write_parquet(rows, args.out)
    _log(f"[landscape] wrote {args.out} in {time.time() - started:.1f}s")


def cmd_linearity(args) -> None:
    import itertools

    import pandas as pd

    from dpmerge.diagnostics import joint_task_linearity, task_loss
    from dpmerge.taskvectors import load_tensors

    _set_threads(args.threads)
    if not args.alphas or any(not 0 < a < 1 for a in args.alphas):
        raise SystemExit(f"error: --alphas must lie strictly between 0 and 1, got {args.alphas}")
    curvature = pd.read_parquet(args.curvature)
    if "lambda_max_at_task" not in curvature.columns:
        raise SystemExit(f"error: {args.curvature} has no lambda_max_at_task column; give a 'dpmerge curvature' file")
    lambda_max = curvature.drop_duplicates("task").set_index("task")["lambda_max_at_task"]
    used = set(curvature["num_examples"]) if "num_examples" in curvature.columns else set()
    backbone = backbone_from_spec(_json_arg(args.backbone_spec, "--backbone-spec"))
    base, _ = load_tensors(args.base)
    vectors, _ = _read_task_vectors(args.task_vectors)
    tasks = _load_heads_and_data(args.heads, args.data)
    if len(tasks) < 2:
        raise SystemExit("error: joint-task linearity needs two or more tasks")
    models = []
    for vector, (head, meta, prepared) in zip(vectors, tasks):
        task = prepared["task"]
        if task not in lambda_max.index:
            raise SystemExit(f"error: {args.curvature} has no lambda_max for task {task!r}")
        features, labels = _test_subsample(prepared, args.max_examples)
        if used and int(labels.shape[0]) not in used:
            raise SystemExit(f"error: --max-examples gives {labels.shape[0]} examples of {task}, but "
                             f"{args.curvature} measured lambda_max on {sorted(used)}; use its max_examples")
        params = {name: base[name] + vector[name] for name in base}
        models.append((task, meta, task_loss(backbone, head, features, labels), params))
    rows = []
    for (s, meta, loss_s, w_s), (t, _, loss_t, w_t) in itertools.combinations(models, 2):
        for point in joint_task_linearity(loss_s, loss_t, w_s, w_t, args.alphas, float(lambda_max[s]),
                                          float(lambda_max[t])):
            rows.append({**_identity(meta), "task_s": s, "task_t": t, **point})
        worst = max(rows[-len(args.alphas):], key=lambda r: abs(r["delta"]))
        _log(f"[linearity] {s} / {t}: largest |delta| {abs(worst['delta']):.4g} at alpha {worst['alpha']:g}, "
             f"bound {worst['bound']:.4g}")
    _write_parquet(rows, args.out)


TABLE_KINDS = {
    "multitask": "Tables 1-3: every method's individual and merged scores per task (--metric-in-header: GLUE style)",
    "epsilon_sweep": "Table 4: --operator's average merged score per privacy budget, naive DP vs DP-Merging",
    "ablation": "Table 5: naive DP, w/o alignment, w/o flatness, full DP-Merging, per operator",
    "rho": "Table 6: DP-Merging + --operator at each SAM radius rho",
    "anchor_lambda": "Table 7: DP-Merging + --operator at each anchor strength lambda",
    "operators": "Table 8: naive DP vs DP-Merging per merge operator",
}


def cmd_table(args) -> None:
    import pandas as pd

    from dpmerge import tables

    scores = pd.concat([pd.read_parquet(p) for p in args.scores], ignore_index=True)
    if args.metric_in_header and args.kind != "multitask":
        raise SystemExit("error: --metric-in-header applies to --kind multitask only")
    try:
        if args.kind == "multitask":
            table = tables.table1(scores, metric_in_header=args.metric_in_header)
        elif args.kind == "epsilon_sweep":
            table = tables.table_epsilon_sweep(scores, operator=args.operator)
        elif args.kind == "ablation":
            table = tables.table_ablation(scores)
        elif args.kind in ("rho", "anchor_lambda"):
            table = tables.table_sensitivity(scores, args.kind, operator=args.operator)
        else:
            table = tables.table_operators(scores)
    except ValueError as error:
        raise SystemExit(f"error: {args.kind} table from {len(args.scores)} score files: {error}")
    for path in tables.write_table(table, args.out_prefix, args.caption):
        _log(f"[table] wrote {path}")


def cmd_plot_sharpness_drift(args) -> None:
    import pandas as pd

    from dpmerge.figures import plot_sharpness_drift

    curvature = pd.concat([pd.read_parquet(p) for p in args.curvature], ignore_index=True)
    drift = pd.concat([pd.read_parquet(p) for p in args.drift], ignore_index=True)
    try:
        plot_sharpness_drift(curvature, drift, args.out, args.title)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
    _log(f"[figure] wrote {', '.join(args.out)}")


def cmd_plot_gap_bound(args) -> None:
    import pandas as pd

    from dpmerge.figures import plot_gap_vs_bound

    curvature = pd.concat([pd.read_parquet(p) for p in args.curvature], ignore_index=True)
    plot_gap_vs_bound(curvature, args.out, args.title)
    _log(f"[figure] wrote {', '.join(args.out)}")


def cmd_plot_interpolation(args) -> None:
    import pandas as pd

    from dpmerge.tables import plot_interpolation

    curves = pd.concat([pd.read_parquet(p) for p in args.curves], ignore_index=True)
    plot_interpolation(curves, args.out, args.title)  # drawn once, saved in every format asked for
    _log(f"[figure] wrote {', '.join(args.out)}")


def cmd_plot_landscape(args) -> None:
    import pandas as pd

    from dpmerge.figures import plot_landscape

    frames = [pd.read_parquet(p) for p in args.landscapes]
    for out in args.out:
        plot_landscape(frames, out, args.title)
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

    def add_figure_outputs(p):
        p.add_argument("--title", default="", help="figure title")
        p.add_argument("-o", "--out", nargs="+", required=True, help="output image(s): .png and/or .pdf")

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
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, help="output .pt file")

    p.add_argument("--data-dir", default=None,
                   help="directory holding the paper's datasets (paper_data.py layouts); embedded tasks ignore it")
    p.add_argument("--workers", type=int, default=1, help="threads decoding a paper dataset's images")

    p = add("zeroshot-head", cmd_zeroshot_head,
            "CLIP zero-shot head of one task: text embeddings of its class names in the task's prompt templates.")
    p.add_argument("--backbone", required=True)
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--data", required=True, help="prepared task file from 'dpmerge prepare' (for the class names)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, help="output .safetensors")

    p = add("prepare-data", cmd_prepare_data,
            "Download one of the paper's datasets into the data directory in the layout 'prepare' reads (online).")
    p.add_argument("--task", required=True, help="a vision task (sun397, cars, ...) or a GLUE task (cola, ...)")
    p.add_argument("--data-dir", required=True)

    p = add("make-standins", cmd_make_standins,
            "Write a tiny random CLIP and RoBERTa and tiny copies of the 16 paper datasets in their real formats.")
    p.add_argument("--out", required=True, help="directory; gets clip/, roberta/ and data/")
    p.add_argument("--vision-classes", type=int, default=3, help="classes per stand-in vision dataset")
    p.add_argument("--train-per-class", type=int, default=24)
    p.add_argument("--test-per-class", type=int, default=8)
    p.add_argument("--image-size", type=int, default=40, help="side of the stand-in images (before resizing)")
    p.add_argument("--seed", type=int, default=0)

    p = add("pretrained", cmd_pretrained, "Save the pretrained weights w0 of the trainable (merged) parameters.")
    p.add_argument("--backbone", required=True)
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--out", required=True, help="output .safetensors")

    p = add("finetune", cmd_finetune, "Fine-tune one task privately and release its task vector and head.")
    p.add_argument("--backbone", required=True)
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--data", required=True, help="prepared task file from 'dpmerge prepare'")
    p.add_argument("--method", required=True,
                   help="nonprivate, naive_dp, dp_merging, dp_sam or dp_anchor; a sensitivity run's label such as "
                        "dp_merging-rho0.1 or dp_merging-lambda0.5 must match the value in --hparams")
    p.add_argument("--epsilon", type=float, default=None,
                   help="target epsilon (delta = 1/N unless --hparams gives delta <= 1/N)")
    p.add_argument("--seed", type=int, default=0,
                   help="repetition index, recorded in the release (default 0); the randomness comes from the "
                        "study key, not from this number")
    p.add_argument("--study-key", required=True, help=STUDY_KEY_HELP)
    p.add_argument("--hparams", default="{}",
                   help="JSON of FinetuneConfig fields (epochs, batch_size, lr, neighbouring, rng, ...)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-vector", required=True, help="task vector .safetensors")
    p.add_argument("--out-head", required=True, help="task head .safetensors")
    p.add_argument("--checkpoint", help="resumable state file, kept outside the outputs (removed when done)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    # nargs="?": the workflow passes the flag with an empty value for backbones that train their heads
    p.add_argument("--zeroshot-head", nargs="?", default=None, const=None,
                   help="frozen head from 'dpmerge zeroshot-head' (CLIP backbones); otherwise a fresh head is trained")

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
    p.add_argument("--examples", type=int, default=256,
                   help="examples per task (default 256): private, the expected size of a Poisson sample at rate "
                        "examples/N; public, the size of a fixed subset of the public dataset")
    p.add_argument("--clip-norm", type=float, help="private: L2 bound of each example's whole contribution")
    p.add_argument("--epsilon", type=float, help="private: the statistic's own epsilon at the task's delta")
    p.add_argument("--study-key", help="private: " + STUDY_KEY_HELP)
    p.add_argument("--public-data", help="public: the prepared file ('dpmerge prepare') of a dataset declared "
                                         "public, outside every private training set")
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

    p = add("linearity", cmd_linearity,
            "Joint-task loss linearity (Theorem C.8) per task pair: delta_{s,t}(alpha) = L_JTL(alpha w_s + "
            "(1 - alpha) w_t) - alpha L_JTL(w_s) - (1 - alpha) L_JTL(w_t), L_JTL = L_s + L_t, beside its bound "
            "1/2 alpha (1 - alpha) (lambda_s + lambda_t) ||w_s - w_t||^2 with lambda from a curvature file.")
    p.add_argument("--curvature", required=True, help="the release group's 'dpmerge curvature' file (lambda_max per task)")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained top weights (safetensors)")
    p.add_argument("--task-vectors", nargs="+", required=True, help="task vectors (safetensors), one per task")
    p.add_argument("--heads", nargs="+", required=True, help="one head per task vector, same order")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                   help="points strictly inside (0, 1) of the segment between two task models (default 0.25 0.5 0.75)")
    p.add_argument("--max-examples", type=int, default=64,
                   help="seeded test subsample per task; must match the curvature file's (default 64)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-o", "--out", required=True, help="output .parquet")

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

    p = add("landscape", cmd_landscape,
            "2-D loss landscape of a merged model (paper App. B.4, Figs. 4, 5): every task's test loss and their "
            "mean at w_merge + a d1 + b d2, on two filter-normalised random directions (Li et al. 2018) or on "
            "the plane of two task vectors.")
    p.add_argument("--backbone-spec", required=True, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained top weights w0 (safetensors)")
    p.add_argument("--merged", required=True, help="merged model (safetensors): the centre (0, 0) of the plane")
    p.add_argument("--task-vectors", nargs="+",
                   help="task vectors (safetensors); the first two span the task_vectors plane, the random plane "
                        "does not use them")
    p.add_argument("--heads", nargs="+", required=True, help="one head per task, same order as --data")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files; the mean over these tasks is "
                                                            "the merged model's multi-task loss")
    p.add_argument("--plane", choices=["random", "task_vectors"], default="random",
                   help="random: two filter-normalised Gaussian directions (biases and norm layers unmoved); "
                        "task_vectors: the first two task vectors, unscaled (default random)")
    p.add_argument("--points", type=int, default=9, help="grid points per axis, >= 3 (default 9: 81 points)")
    p.add_argument("--span", type=float, default=1.0,
                   help="each coordinate runs over linspace(-span, span, points) (default 1.0)")
    p.add_argument("--max-examples", type=int, default=64, help="seeded test subsample per task (default 64)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random directions: seed and seed + 1 (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("-o", "--out", required=True,
                   help="output Parquet: per grid point (a, b) one row per task and one of task 'mean'")

    kinds = "; ".join(f"{name} = {text}" for name, text in TABLE_KINDS.items())
    p = add("table", cmd_table, f"A paper table (Parquet, Markdown, LaTeX, HTML) from evaluation files: {kinds}. "
                                "Cells are means over seeds, with +- the standard deviation where there are several.")
    p.add_argument("scores", nargs="+", help="evaluation .parquet files ('dpmerge evaluate')")
    p.add_argument("--kind", choices=list(TABLE_KINDS), default="multitask", help="which table (see above)")
    p.add_argument("--operator", default="ties", help="merge the epsilon_sweep, rho and anchor_lambda tables report")
    p.add_argument("--metric-in-header", action="store_true", help="name each task's metric in its column header")
    p.add_argument("--caption", default="", help="caption written above the table")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet, PREFIX.md, PREFIX.tex, PREFIX.html")

    p = add("plot-sharpness-drift", cmd_plot_sharpness_drift,
            "Fig. 3: sharpness proxy and reference drift against epsilon, one line per method.")
    p.add_argument("--curvature", nargs="+", required=True, help="curvature .parquet files ('dpmerge curvature')")
    p.add_argument("--drift", nargs="+", required=True, help="drift .parquet files ('dpmerge drift')")
    add_figure_outputs(p)

    p = add("plot-gap-bound", cmd_plot_gap_bound,
            "Measured merge gap against Theorem 5.2's bound and Eq. (3)'s second-order estimate, per task model.")
    p.add_argument("curvature", nargs="+", help="curvature .parquet files ('dpmerge curvature')")
    add_figure_outputs(p)

    p = add("plot-interpolation", cmd_plot_interpolation, "Figure of interpolation curves per task and method.")
    p.add_argument("curves", nargs="+", help="interpolation .parquet files")
    add_figure_outputs(p)

    p = add("plot-landscape", cmd_plot_landscape,
            "Contour figure of loss landscapes (paper Figs. 4, 5): one panel per file, on one shared loss scale.")
    p.add_argument("landscapes", nargs="+", help="landscape .parquet files from 'dpmerge landscape', one per panel")
    add_figure_outputs(p)

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
