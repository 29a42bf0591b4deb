"""What several stages share: progress lines, the names a released file records for its inputs, released task
vectors read with their privacy records, heads read with their prepared tasks, the identity columns of a result
row, Parquet output, and the diagnostics' fixed test subsample.
"""

from __future__ import annotations

import os
import sys

import pandas as pd
import torch

from dpmerge.artifacts import atomic_write, check_privacy_record, load_prepared, load_tensors, tensors_sha256
from dpmerge.epsilon import epsilon_column_value


def log(message: str) -> None:
    # flushed at once: Snakemake jobs redirect stdout to a log file that is read while the job runs
    print(message, flush=True)


def warn(message: str) -> None:
    """What a user must see even when stdout goes to a log: on stderr."""
    print(f"dpmerge: warning: {message}", file=sys.stderr, flush=True)


def recorded_paths(paths: list[str], out: str | list[str]) -> list[str]:
    """How a released file or the ledger (`out`, one path or several) names the files `paths` it was made from:
    relative to the deepest folder that holds them all and `out`, which in the workflow's layout is the results
    folder (`taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors`). Never an absolute path: a release is
    copied and shared, and must not tell where this machine keeps it or whose account ran it. Files that share no
    folder but the file system's root are named relative to the working directory instead."""
    written = [out] if isinstance(out, str) else list(out)
    absolute = [os.path.abspath(path) for path in [*paths, *written]]
    anchor = os.path.commonpath([os.path.dirname(path) for path in absolute])
    if anchor == os.path.dirname(anchor):  # the root: no folder they share
        anchor = os.getcwd()
    return [os.path.relpath(path, anchor) for path in absolute[:len(paths)]]


def read_task_vectors(paths: list[str], require_record: bool = True) -> tuple[list[dict], list[dict]]:
    """Task vectors and their metadata, each refused unless it carries its full privacy record (unless not
    `require_record`: plain vectors, from anyone)."""
    vectors, metas = [], []
    for path in paths:
        tensors, meta = load_tensors(path)
        if require_record:
            check_privacy_record(meta, path)
        vectors.append(tensors)
        metas.append(meta)
    return vectors, metas


def check_w0_labels(path: str, w0_meta: dict, metas: list[dict], vector_paths: list[str], strict: bool) -> None:
    """Refuse task vectors whose `pretrained_sha256` label differs from w0's (not `strict`: only where both
    sides have one). The label names the backbone checkpoint, which w0 cannot be hashed back to; the weights
    themselves are compared by `check_w0_content`."""
    label = w0_meta.get("pretrained_sha256")
    for meta, vector_path in zip(metas, vector_paths):
        claimed = meta.get("pretrained_sha256")
        if (strict or (label is not None and claimed is not None)) and label != claimed:
            raise ValueError(f"{vector_path} was trained from other pretrained weights than {path}: the vector "
                             f"records pretrained_sha256 {claimed!r}, {path} records {label!r}")


def check_w0_content(path: str, w0_meta: dict, content: str, metas: list[dict], vector_paths: list[str],
                     strict: bool, vectors_content: str | None = None) -> None:
    """Refuse a w0 whose content hash `content` (artifacts.tensors_sha256) is not the `w0_sha256` it was
    written with, or whose hash over the vectors' tensors (`vectors_content`, default `content`: a base of
    exactly the vectors' tensors) is not the one each task vector records for the w0 it was trained from. Not
    `strict` (vectors from anyone): a vector recording no hash passes with a warning; `strict`, it is refused."""
    vectors_content = vectors_content or content
    written = w0_meta.get("w0_sha256")
    if written is not None and written != content:
        raise ValueError(f"{path}: its tensors hash to {content[:16]}..., not to the w0_sha256 {str(written)[:16]}... "
                         "it was written with: the file changed since 'dpmerge pretrained' wrote it")
    unchecked = []
    for meta, vector_path in zip(metas, vector_paths):
        recorded = meta.get("w0_sha256")
        if recorded is None and not strict:
            unchecked.append(vector_path)
            continue
        if recorded is None:
            raise ValueError(f"{vector_path} records no w0_sha256, the content hash of the w0 it was trained from "
                             f"(vectors released before 'dpmerge finetune' recorded it lack it), so {path} cannot be "
                             "checked against it: fine-tune it again")
        if recorded != vectors_content:
            raise ValueError(f"{path} is not the w0 {vector_path} was trained from: its tensors hash to "
                             f"{vectors_content[:16]}..., the vector records w0_sha256 {str(recorded)[:16]}...")
    if unchecked:
        more = ", ..." if len(unchecked) > 1 else ""
        warn(f"{len(unchecked)} task vector(s) record no w0_sha256 ({unchecked[0]}{more}): nothing checks that "
             f"{path} is the w0 they were trained from")


def checked_w0(path: str, metas: list[dict] = (), vector_paths: list[str] = (), merged_meta: dict | None = None,
               merged_path: str | None = None, strict: bool = True) -> dict[str, torch.Tensor]:
    """w0's tensors, loaded once and checked as the merge checks its base (stages/merge.checked_base): finite,
    the weights it was written as, the w0 every released vector (`metas`, from `vector_paths`) was trained
    from, and the base the merged model (`merged_meta`, from `merged_path`) was built on. The evaluation and
    diagnostics read w0 to rebuild w0 + tau: a wrong one would score a model no one released. Not `strict`
    (plain vectors, from anyone): a label or hash is compared wherever both sides have one."""
    w0, w0_meta = load_tensors(path)
    for key, value in w0.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise ValueError(f"{path}: tensor {key!r} contains NaN or Inf")
    check_w0_labels(path, w0_meta, metas, vector_paths, strict=strict)
    content = tensors_sha256(w0)
    check_w0_content(path, w0_meta, content, metas, vector_paths, strict=strict)
    if merged_meta is not None:
        built_on = (merged_meta.get("base") or {}).get("sha256")
        if built_on is None:
            raise ValueError(f"{merged_path} records no base hash, so nothing says it was built on {path}: "
                             "merge it again with this version of 'dpmerge merge'")
        if built_on != content:
            raise ValueError(f"{merged_path} was merged on another base than {path}: it records base sha256 "
                             f"{built_on[:16]}..., {path}'s tensors hash to {content[:16]}...")
    return w0


def load_heads_and_data(heads: list[str], data: list[str]) -> list[tuple[dict, dict, dict]]:
    """(head, head metadata, prepared task) per task, refusing a head of another task than its data."""
    if len(heads) != len(data):
        raise ValueError(f"{len(heads)} --heads but {len(data)} --data files; give one head per task")
    out = []
    for head_path, data_path in zip(heads, data):
        head, meta = load_tensors(head_path)
        prepared = load_prepared(data_path)
        if meta.get("task") != prepared["task"]:
            raise ValueError(f"head {head_path} is for task {meta.get('task')!r}, data {data_path} for "
                             f"{prepared['task']!r}")
        out.append((head, meta, prepared))
    return out


def release_identity(meta: dict) -> dict:
    """The columns that say which release a result row belongs to, from a task vector's or head's metadata."""
    return {
        "backbone": meta.get("backbone"),
        "method": meta.get("method"),
        "target_epsilon": epsilon_column_value(meta.get("target_epsilon")),  # float, inf for non-private
        "seed": meta.get("seed"),
        # The sensitivity tables (6, 7) tell DP-Merging runs apart by these
        "rho": float(meta.get("rho", 0.0)),
        "anchor_lambda": float(meta.get("anchor_lambda", 0.0)),
    }


def merge_label(merged_meta: dict) -> str:
    """A merged model's name in scores and tables: its merge name, or its operator for older files."""
    return merged_meta.get("merge_name", merged_meta["operator"])


def write_parquet(rows: list[dict], out: str) -> None:


    atomic_write(out, lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False))


def fixed_test_subsample(prepared: dict, max_examples: int):
    """(features, labels) of a fixed, seeded test subsample: a diagnostic's cost stays predictable and every
    diagnostic and model sees the same examples."""
    n = min(max_examples, int(prepared["test_labels"].shape[0]))
    pick = torch.randperm(prepared["test_labels"].shape[0], generator=torch.Generator().manual_seed(0))[:n]
    return tuple(f[pick] for f in prepared["test_features"]), prepared["test_labels"][pick]
