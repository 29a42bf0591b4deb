"""Merging a release group's task vectors. Rules: merge_statistics (`statistics`: per-task RegMean Grams or
Fisher diagonals, on public data or privatized private data) and merge (`merge`: any registered operator,
streamed tensor by tensor into w0 + merged vector).
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import torch

from dpmerge.artifacts import (
    RELEASE_HASH,
    SafetensorsFile,
    check_output_path,
    check_privacy_record,
    check_release_content,
    file_tensors_sha256,
    load_prepared,
    load_tensors,
    missing_privacy_fields,
    save_tensors,
    tensors_sha256_of,
    write_tensors_streaming,
)
from dpmerge.checkpoints import open_checkpoint, output_model_path, write_model_like
from dpmerge.epsilon import epsilon_value
from dpmerge.merge.registry import is_part, resolve_merge
from dpmerge.merge.sources import SafetensorsSource, StatisticsSource
from dpmerge.merge.specs import NEEDS_STATISTICS
from dpmerge.merge.storage import personalized_storage
from dpmerge.models.base import task_model_weights
from dpmerge.models.spec import backbone_from_spec
from dpmerge.privacy.release import check_public_dataset, check_release_group, merged_release_budget
from dpmerge.privacy.release_log import (
    check_replacement,
    publish_tensors,
    release_log_path,
    statistics_settings,
)
from dpmerge.privacy.statistics import fisher_statistics, gram_statistics, private_sample, statistic_identity
from dpmerge.privacy.study_key import StudyKeyError, load_or_create_key, mechanism_fingerprint
from dpmerge.runtime import compute_section, progress
from dpmerge.stages.common import (
    check_w0_content,
    check_w0_labels,
    checked_w0,
    log,
    read_task_vectors,
    recorded_paths,
    release_identity,
    warn,
)


def merge(*, operator: str, task_vectors: list[str], base: str, out: str | None = None,
          output_model: str | None = None, vectors: str = "task", name: str | None = None,
          params: dict | None = None, statistics: str | None = None, require_privacy_record: bool = False,
          allow_single: bool = False) -> None:
    """Merge task vectors with `operator` (hyperparameters `params`) into a model w0 + merged vector.

    Vectors and base are checkpoints as people have them (checkpoints.open_checkpoint: a safetensors file, a
    sharded index or a model folder, save_pretrained's metadata included). The base may hold more than the
    vectors (a full checkpoint): its other tensors pass through unchanged. `out` is one safetensors file with
    the merge's record; `output_model` (or both) writes the same weights in the base's layout
    (checkpoints.write_model_like: a model folder keeps its config), loadable by `from_pretrained`.

    `vectors` "task" merges the task vectors, "difference" their differences around the weight average.
    RegMean and Fisher read `statistics` (from `statistics` below), checked against the vectors, and the base
    w0 is checked like any input (`checked_base`). The output's metadata records the inputs (w0 included, by
    their paths relative to the results folder: `recorded_paths`), the hyperparameters and the (epsilon, delta)
    the model is released at.

    Released vectors (every one with its full privacy record) must form one release group, each within its
    budget. Anyone's vectors without records merge too, with a warning on stderr, and the merged model records
    `privacy: none recorded`; `require_privacy_record` (what the pipeline passes) refuses them instead. Either
    way a path or a vector given twice, two vectors of one task and, unless `allow_single`, a lone vector are
    refused.
    """
    checked = check_merge(operator, task_vectors, base, out, output_model, vectors, params, statistics,
                          require_privacy_record, allow_single)
    source = SafetensorsSource(task_vectors, checked.statistics_source)  # every vector has the first one's tensors
    check_base_covers(base, checked.w0, task_vectors[0], source.files[0])
    passed_through = [key for key in checked.w0.keys() if key not in set(source.keys())]
    name = name or (operator if vectors == "task" else f"{operator}_{vectors}")
    meta = merge_record(checked, operator, name, vectors, task_vectors, base, statistics, out or output_model,
                        passed_through)
    w0 = checked.w0
    layout = {key: (w0.dtype(key), w0.shape(key)) for key in source.keys()}
    if checked.plan.personalized:
        # One model per task at evaluation: the shared tensors (a loadable model) plus per-task parts.
        meta["personalized"] = storage = personalized_storage(checked.plan, layout)
        extra, model = storage["extra_bits_per_task"], storage["model_bits"]
        log(f"[merge] {operator}: {extra / 8 / 2**20:.2f} MiB per task beside the shared model "
            f"({100 * extra / model:.1f} % of one model)")
    layout = checked.plan.stored_layout(layout, len(checked.metas))
    layout.update({key: (w0.dtype(key), w0.shape(key)) for key in passed_through})
    with compute_section("merge (read, merge and write, streamed)", log), merged_file(out, output_model) as path:
        # a failure midway leaves no file
        write_tensors_streaming(path, layout, merged_model(checked, operator, source, passed_through), meta)
        if output_model:
            write_model_like(base, SafetensorsFile(path), output_model, meta)
    written = " and ".join(str(p) for p in (out, output_model) if p)
    passed = f", {len(passed_through)} tensors of the base passed through" if passed_through else ""
    log(f"[merge] {name}: {operator} {checked.plan.hyperparameters} of {vectors} vectors over {len(checked.metas)} "
        f"task vectors (streamed{passed}) -> {written}")


@dataclass(frozen=True)
class CheckedMerge:
    """What `check_merge` established before any tensor is merged: the operator's plan, the vectors' records
    (and whether they carry privacy records), w0 and its hash, each vector's path and hash, and the statistics
    RegMean and Fisher read (with their record)."""

    plan: object
    metas: list[dict]
    recorded: bool
    w0: object
    w0_sha256: str
    inputs: list[dict]
    statistics_source: object
    statistics_meta: dict | None


def check_merge(operator, task_vectors, base, out, output_model, vectors, params, statistics,
                require_privacy_record, allow_single) -> CheckedMerge:
    """Every check of a merge's inputs and outputs, before anything is merged (see `merge`)."""
    plan = resolve_merge(operator, vectors, **(params or {}))  # checked now, before anything is read
    if not out and not output_model:
        raise ValueError("give -o/--out (a merged .safetensors file), --output-model (a checkpoint in the base's "
                         "layout) or both")
    if out:
        check_output_path(out)
    if output_model:
        if plan.personalized:
            raise ValueError(f"{operator} keeps per-task parts beside the shared model, one model per task: "
                             "--output-model writes one model; use -o")
        output_model_path(base, output_model)
    check_distinct_paths(task_vectors, allow_single)
    metas, recorded = merge_records(task_vectors, require_privacy_record)
    if recorded:
        check_release_group(metas)
    covered = open_checkpoint(task_vectors[0]).keys()
    w0, w0_sha256 = checked_base(base, metas, task_vectors, covered, strict=recorded)
    inputs = distinct_inputs(task_vectors)  # each vector read and hashed once, here
    statistics_source, statistics_meta = None, None
    if operator in NEEDS_STATISTICS and not recorded:
        raise ValueError(f"{operator} reads per-task statistics of released task vectors ('dpmerge statistics'); "
                         "these carry no privacy record")
    if operator in NEEDS_STATISTICS:
        if not statistics:
            raise ValueError(f"{operator} needs --statistics (from 'dpmerge statistics --kind "
                             f"{NEEDS_STATISTICS[operator]}')")
        statistics_source, statistics_meta = statistics_source_of(statistics, NEEDS_STATISTICS[operator], metas,
                                                                  inputs)
    elif statistics:
        raise ValueError(f"{operator} uses no data statistics; drop --statistics")
    return CheckedMerge(plan, metas, recorded, w0, w0_sha256, inputs, statistics_source, statistics_meta)


def merged_model(checked: CheckedMerge, operator: str, source, passed_through: list[str]):
    """(name, tensor) of the merged model, streamed: w0 + merged tensor, each written as soon as it is computed
    (memory holds one tensor per task vector plus the operator's temporaries, never a whole model), then the
    base's tensors no vector covers (a full checkpoint's frozen parts, buffers), unchanged."""
    w0 = checked.w0

    def model_tensor(key: str, merged: torch.Tensor) -> torch.Tensor:
        # Checked before it is written: a NaN or Inf merges into a model that loads and scores nothing (the write
        # is atomic, so a refused merge leaves no file). Stored at w0's precision, whatever the operator used.
        if merged.is_floating_point() and not torch.isfinite(merged).all():
            raise ValueError(f"{operator} gave NaN or Inf in tensor {key!r} ({int((~torch.isfinite(merged)).sum())} "
                             f"of {merged.numel()} entries); nothing was written")
        if source.files[0].dtype(key) != w0.dtype(key):  # e.g. float32 vectors of a bfloat16 base: add, then round
            return task_model_weights({key: w0.get_tensor(key)}, {key: merged})[key].to(w0.dtype(key))
        return task_model_weights({key: w0.get_tensor(key)}, {key: merged.to(w0.dtype(key))})[key]

    merged = ((key, tensor if is_part(key) else model_tensor(key, tensor))
              for key, tensor in checked.plan.stream(source))
    merged = logged_tensors(merged, len(source.keys()), operator)
    return chain(merged, ((key, w0.get_tensor(key)) for key in passed_through))


def merge_record(checked: CheckedMerge, operator: str, name: str, vectors: str, task_vectors: list[str], base: str,
                 statistics: str | None, written_to: str, passed_through: list[str]) -> dict:
    """The merged model's metadata: its inputs (named relative to the results folder, never by this machine's
    absolute paths: `recorded_paths`), the hyperparameters and the (epsilon, delta) it is released at."""
    metas = checked.metas
    files = [*task_vectors, base, *([statistics] if statistics else [])]
    named = dict(zip(files, recorded_paths(files, written_to)))
    meta = {
        "artifact": "merged_model",
        "operator": operator,
        "merge_name": name,
        "vectors": vectors,
        "hyperparameters": checked.plan.hyperparameters,
        "backbone": metas[0].get("backbone"),
        "method": metas[0].get("method"),
        "target_epsilon": metas[0].get("target_epsilon"),
        "seed": metas[0].get("seed"),
        "pretrained_sha256": metas[0].get("pretrained_sha256"),
        "tasks": [m.get("task", Path(p).stem) for m, p in zip(metas, task_vectors)],
        "inputs": [{**entry, "path": named[path]} for entry, path in zip(checked.inputs, task_vectors)],
        "base": {"path": named[base], "sha256": checked.w0_sha256},
        RELEASE_HASH: "",  # a release too: its own hash, written with it, which every reader checks
    }
    if passed_through:
        meta["base"]["passed_through"] = len(passed_through)
    if checked.recorded:
        meta["release_epsilon"], meta["release_delta"] = merged_release_budget(metas, checked.statistics_meta)
    else:
        meta["privacy"] = "none recorded"
    if checked.statistics_meta is not None:
        meta["statistics"] = {"path": named[statistics], "kind": checked.statistics_meta["kind"],
                              "source": checked.statistics_meta["source"],
                              "records": checked.statistics_meta["records"]}
    return meta


@contextmanager
def merged_file(out: str | None, output_model: str):
    """The path the merged weights are streamed to: `out`, or without one a temporary file beside the output
    model that is gone afterwards (the model in the base's layout is copied from it one tensor at a time)."""
    if out:
        yield out
        return
    folder = Path(output_model).absolute().parent
    folder.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{Path(output_model).name}.", suffix=".safetensors", dir=folder)
    os.close(handle)
    try:
        yield temporary
    finally:
        Path(temporary).unlink(missing_ok=True)


def check_base_covers(base: str, w0, first_vector: str, vector) -> None:
    """The base holds every tensor the vectors hold, at their shape, and at their dtype or, both floating point,
    another precision (float32 vectors of a bfloat16 model); it may hold more (a full checkpoint, whose other
    tensors pass through). Errors name both files and the tensor."""
    held = set(w0.keys())
    missing = [key for key in vector.keys() if key not in held]
    if missing:
        raise ValueError(f"{base} lacks tensors that {first_vector} has: {missing[:5]} (the base must hold every "
                         f"tensor of the task vectors; {len(missing)} missing)")
    for key in vector.keys():
        if w0.shape(key) != vector.shape(key):
            raise ValueError(f"{first_vector}: tensor {key!r} has shape {vector.shape(key)}, {base} has "
                             f"{w0.shape(key)}")
        same = w0.dtype(key) == vector.dtype(key)
        if not same and not (w0.dtype(key).is_floating_point and vector.dtype(key).is_floating_point):
            raise ValueError(f"{first_vector}: tensor {key!r} has dtype {vector.dtype(key)}, {base} has "
                             f"{w0.dtype(key)}")


def logged_tensors(items, total: int, operator: str, every_seconds: float = 10.0):
    """Pass (key, tensor) pairs through, logging how many of the `total` shared tensors are merged, with a rate and
    an ETA, at most every `every_seconds` and at the last one: iterative operators (WUDI's Adam per matrix) take
    minutes on a CLIP tower, and a silent job looks hung."""
    started = last = time.perf_counter()
    done = 0
    for key, tensor in items:
        yield key, tensor
        if is_part(key):
            continue
        done += 1
        now = time.perf_counter()
        if done == total or now - last >= every_seconds:
            log(f"[merge] {operator}: tensor {progress(done, total, started)}")
            last = now


def check_distinct_paths(paths: list[str], allow_single: bool) -> None:
    """Refuse a path given twice and, unless asked for, a merge of one vector (usually a glob that matched one)."""
    if len(paths) < 2 and not allow_single:
        raise ValueError(f"a merge needs at least two task vectors, got {len(paths)} ({', '.join(paths) or 'none'}); "
                         "pass --allow-single to write w0 plus one vector")
    seen: dict[Path, str] = {}
    for path in paths:
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ValueError(f"{path} is given twice (also as {seen[resolved]}): each task vector once")
        seen[resolved] = path


def merge_records(paths: list[str], require_privacy_record: bool) -> tuple[list[dict], bool]:
    """Each vector's metadata and whether all of them are releases (full privacy records), checked as such:
    within budget, one vector per task. Without records (unless required) the merge goes on, warned."""
    metas = [open_checkpoint(path).metadata for path in paths]
    for path, meta in zip(paths, metas):
        if RELEASE_HASH in meta:  # streamed below one tensor at a time: the release is checked whole first
            check_release_content(path, meta, file_tensors_sha256(path))
    if require_privacy_record:
        for path, meta in zip(paths, metas):
            check_privacy_record(meta, path)
    missing = {path: missing_privacy_fields(meta) for path, meta in zip(paths, metas)}
    lacking = [(path, fields) for path, fields in missing.items() if fields]
    for path, meta in zip(paths, metas):
        if missing[path]:
            continue
        spent, target = epsilon_value(meta["spent_epsilon"]), epsilon_value(meta["target_epsilon"])
        if spent > target:
            raise ValueError(f"{path}: its record spends epsilon {meta['spent_epsilon']}, above its target "
                             f"{meta['target_epsilon']}: not a release within its budget")
    tasks: dict[str, str] = {}
    for path, meta in zip(paths, metas):
        task = meta.get("task")
        if task is not None and task in tasks:
            raise ValueError(f"{tasks[task]} and {path} are both task vectors of task {task!r}: a merge takes one "
                             "per task")
        tasks.setdefault(task, path)
    if lacking:
        first, fields = lacking[0]
        warn(f"{len(lacking)} of {len(paths)} task vectors carry no full privacy record ({first} lacks "
             f"{', '.join(fields[:4])}{', ...' if len(fields) > 4 else ''}); merging them anyway: the merged "
             "model records 'privacy: none recorded' and no privacy budget")
    return metas, not lacking


def distinct_inputs(paths: list[str]) -> list[dict]:
    """Each input's path and content hash (recorded in the merged model), refusing the same tensors twice under
    two names: one task counted twice is not a merge of two tasks."""
    inputs, seen = [], {}
    for path in paths:
        digest = tensors_sha256_of(open_checkpoint(path))
        if digest in seen:
            raise ValueError(f"{path} holds the same tensors as {seen[digest]}: each task vector once")
        seen[digest] = path
        inputs.append({"path": path, "sha256": digest})
    return inputs


def checked_base(path: str, metas: list[dict], vector_paths: list[str], covered: list[str], strict: bool = True):
    """The base w0 at `path`, opened, and its content hash, once it has been checked as an input like any other:
    a valid checkpoint, read completely, every tensor finite, and the very weights the task vectors (`metas`,
    read from `vector_paths`; they hold the tensors `covered`) are differences from. A base holding more than
    the vectors (a full checkpoint) is compared with them on the tensors they cover.

    What is compared with what: a vector's `pretrained_sha256` is the hash of the backbone's checkpoint file,
    which w0 (the trainable top of that checkpoint, re-serialised by rule `pretrained`) cannot be hashed back to,
    so it is compared only as a label with the one w0 records. The weights are compared through `w0_sha256`:
    the content hash (artifacts.tensors_sha256 of names, dtypes, shapes and bytes) of the pretrained top a
    fine-tune started from, which `dpmerge finetune` records with every vector and `dpmerge pretrained` with
    w0, recomputed here from w0's tensors. A file with the right label and other weights is refused.

    Not `strict` (vectors without privacy records, from anyone): a label or hash is compared wherever both
    sides have one; a vector without `w0_sha256` is let through with a warning, since nothing can say which
    weights it is a difference from. The file itself is checked in full either way.
    """
    w0 = open_checkpoint(path)
    check_w0_labels(path, w0.metadata, metas, vector_paths, strict)
    content = tensors_sha256_of(w0, finite=True)
    covered_content = content
    if set(covered) != set(w0.keys()) and set(covered) <= set(w0.keys()):
        covered_content = tensors_sha256_of(w0, covered)
    check_w0_content(path, w0.metadata, content, metas, vector_paths, strict, vectors_content=covered_content)
    return w0, content


def statistics_source_of(path: str, kind: str, metas: list[dict], inputs: list[dict]):
    """The per-task statistics of a `dpmerge statistics` file, checked against the vectors being merged (`inputs`:
    each one's path and content hash, from distinct_inputs), and the file's metadata."""
    file = SafetensorsFile(path)
    meta = file.metadata
    if meta.get("artifact") != "merge_statistics" or meta.get("kind") != kind:
        raise ValueError(f"{path} is not a {kind} statistics file (from 'dpmerge statistics --kind {kind}')")
    check_release_content(path, meta, tensors_sha256_of(file))  # a private statistic is a release: its hash holds
    if meta["tasks"] != [m["task"] for m in metas]:
        raise ValueError(f"{path} covers tasks {meta['tasks']}, the vectors are {[m['task'] for m in metas]}")
    for record, vector in zip(meta["records"], inputs):
        if record["task_vector_sha256"] != vector["sha256"]:
            raise ValueError(f"{path} was computed from another task vector than {vector['path']}")

    class Prefixed:
        def __init__(self, index):
            self.prefix = f"{index}/"

        def keys(self):
            return [k.removeprefix(self.prefix) for k in file.keys() if k.startswith(self.prefix)]

        def get_tensor(self, key):
            return file.get_tensor(self.prefix + key)

    return StatisticsSource([Prefixed(i) for i in range(len(metas))],
                            [f"{path} (task {task})" for task in meta["tasks"]]), meta


def statistics(*, kind: str, source: str, backbone_spec: dict, base: str, task_vectors: list[str],
               heads: list[str], data: list[str], out: str, examples: int = 256, clip_norm: float | None = None,
               epsilon: float | None = None, study_key: str | None = None, public_data: str | None = None,
               replace_release: bool = False) -> None:
    """Per-task `kind` ("gram" or "fisher") statistics of each task model w0 + tau_t, from `source` "public"
    (a fixed subset of `public_data`, free) or "private" (a keyed Poisson sample of the task's own training
    data, clipped to `clip_norm` and noised for `epsilon`, composed with the task's fine-tuning budget). A private
    file is a release: logged in the study's release log before it is written (privacy/release_log.py), and
    refused where the log holds another statistic at `out` unless `replace_release`."""
    check_statistics_arguments(task_vectors, heads, data, source, clip_norm, epsilon, study_key, public_data)
    network = backbone_from_spec(backbone_spec)
    vectors, metas = read_task_vectors(task_vectors)
    w0 = checked_w0(base, metas, task_vectors)  # one read: checked and kept
    vector_hashes = [file_tensors_sha256(path) for path in task_vectors]
    key = mechanism = None
    if source == "private":  # before any data is read: a refused release must cost nothing
        key, mechanism = statistics_mechanism(study_key, kind, metas, vector_hashes, out, replace_release,
                                              {"examples": examples, "clip_norm": clip_norm, "epsilon": epsilon})
    public = None
    if source == "public":
        public = load_prepared(public_data)
        check_public_dataset(public["task"], [m["task"] for m in metas], public_data)
        if public["pretrained_sha256"] != network.checkpoint_sha256:
            raise ValueError(f"{public_data} was prepared from other pretrained weights; rerun prepare")
    tensors, records = {}, []
    for index, (vector, meta, head_path, data_path) in enumerate(zip(vectors, metas, heads, data)):
        prepared = load_prepared(data_path)
        if prepared["task"] != meta["task"]:
            raise ValueError(f"{data_path} holds task {prepared['task']!r}, {task_vectors[index]} "
                             f"was trained on {meta['task']!r}")
        record = {"task": meta["task"], "source": source, "task_vector_sha256": vector_hashes[index]}
        clip, sigma, noise = None, 0.0, None
        if public is not None:
            # Public data needs no secret randomness: a fixed subset, the same for every task and run.
            available = len(public["train_labels"])
            chosen = torch.randperm(available, generator=torch.Generator().manual_seed(0))[:examples]
            features, normaliser = tuple(f[chosen.sort().values] for f in public["train_features"]), len(chosen)
            record.update(public_dataset=public["task"], examples=int(len(chosen)))
        else:
            # Private data: a secret Poisson sample, each example's whole contribution clipped to C, Gaussian
            # noise, a mean over the expected count; accounted and composed (privacy/statistics.py private_sample).
            drawn = private_sample(kind, meta, record["task_vector_sha256"], len(prepared["train_labels"]),
                                   examples, clip_norm, epsilon, key)
            features = tuple(f[drawn.indices] for f in prepared["train_features"])
            clip, sigma, noise, normaliser = clip_norm, drawn.noise_multiplier, drawn.noise, drawn.normaliser
            record.update(drawn.record)
        network.load_top_state(task_model_weights(w0, vector))
        with compute_section(f"{kind} statistics of {meta['task']}", log):
            if kind == "gram":
                result = gram_statistics(network, features, clip, sigma, noise, normaliser=normaliser)
            else:
                head, _ = load_tensors(head_path)
                result = fisher_statistics(network, head, features, clip, sigma, noise, normaliser=normaliser)
        # Statistics of the network's layers, under the names the task vectors are released with.
        result = network.release_statistics(kind, result)
        tensors.update({f"{index}/{name}": value for name, value in result.items()})
        records.append(record)
        used = f"public {public['task']}" if public is not None else "private (Poisson-sampled)"
        count = len(features[0]) if public is not None else f"~{examples} (expected)"
        log(f"[statistics] {kind} of {meta['task']} on {count} {used} examples"
            + (f", sigma {sigma:.3f}, total epsilon {record['total_epsilon']:.4f}" if sigma else ""))
    meta = {"artifact": "merge_statistics", "kind": kind, "source": source,
            "tasks": [m["task"] for m in metas], "records": records, **release_identity(metas[0]),
            "pretrained_sha256": metas[0]["pretrained_sha256"]}
    if public is not None:
        meta["public_dataset"] = public["task"]
        save_tensors(out, tensors, meta)  # public data: no release of private data, nothing to log
    else:
        publish_tensors(release_log_path(study_key), mechanism=mechanism, path=out, tensors=tensors, metadata=meta,
                        artifact="merge_statistics", settings=statistics_settings(
                            kind=kind, examples=examples, clip_norm=clip_norm, epsilon=epsilon))
    log(f"[statistics] wrote {out}")


def statistics_mechanism(study_key: str, kind: str, metas: list[dict], vector_hashes: list[str], out: str,
                         replace_release: bool, settings: dict) -> tuple[bytes, str]:
    """(the study key, the keyed tag of a private statistics file's mechanisms: one per task, each keyed by its
    full identity as its sampler and noise are), once the release log holds no other release at `out` (or
    replacing is allowed)."""
    try:
        key = load_or_create_key(study_key)
    except StudyKeyError as error:
        raise ValueError(f"--study-key: {error}") from None
    mechanism = mechanism_fingerprint(key, {"statistics": [statistic_identity(kind, meta, digest, settings)
                                                           for meta, digest in zip(metas, vector_hashes)]})
    check_replacement(release_log_path(study_key), [out], mechanism, allowed=replace_release)
    return key, mechanism


def check_statistics_arguments(task_vectors, heads, data, source, clip_norm, epsilon, study_key, public_data) -> None:
    if not (len(task_vectors) == len(heads) == len(data)):
        raise ValueError("give one --task-vectors, --heads and --data file per task, in the same order")
    if source == "private" and (clip_norm is None or epsilon is None or study_key is None):
        raise ValueError("--source private needs --clip-norm, --epsilon (the statistic's own budget) and "
                         "--study-key (its sampler and noise are keyed by the study's secret key)")
    if source == "public" and not public_data:
        raise ValueError("--source public needs --public-data: the prepared file ('dpmerge prepare') of a "
                         "dataset declared public, outside every private training set")
    if source == "private" and public_data:
        raise ValueError("--public-data is read only with --source public")
