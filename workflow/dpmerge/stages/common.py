"""What several stages share: progress lines, released task vectors read with their privacy records, heads read
with their prepared tasks, the identity columns of a result row, Parquet output, and the diagnostics' fixed
test subsample.
"""

from __future__ import annotations

import torch

from dpmerge.epsilon import epsilon_column_value


def log(message: str) -> None:
    # flushed at once: Snakemake jobs redirect stdout to a log file that is read while the job runs
    print(message, flush=True)


def warn(message: str) -> None:
    """What a user must see even when stdout goes to a log: on stderr."""
    import sys

    print(f"dpmerge: warning: {message}", file=sys.stderr, flush=True)


def read_task_vectors(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """Task vectors and their metadata, each refused unless it carries its full privacy record."""
    from dpmerge.artifacts import check_privacy_record, load_tensors

    vectors, metas = [], []
    for path in paths:
        tensors, meta = load_tensors(path)
        check_privacy_record(meta, path)
        vectors.append(tensors)
        metas.append(meta)
    return vectors, metas


def load_heads_and_data(heads: list[str], data: list[str]) -> list[tuple[dict, dict, dict]]:
    """(head, head metadata, prepared task) per task, refusing a head of another task than its data."""
    from dpmerge.artifacts import load_prepared, load_tensors

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
    import pandas as pd

    from dpmerge.artifacts import atomic_write

    atomic_write(out, lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False))


def fixed_test_subsample(prepared: dict, max_examples: int):
    """(features, labels) of a fixed, seeded test subsample: a diagnostic's cost stays predictable and every
    diagnostic and model sees the same examples."""
    n = min(max_examples, int(prepared["test_labels"].shape[0]))
    pick = torch.randperm(prepared["test_labels"].shape[0], generator=torch.Generator().manual_seed(0))[:n]
    return tuple(f[pick] for f in prepared["test_features"]), prepared["test_labels"][pick]
