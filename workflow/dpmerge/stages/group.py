"""A release group's scores in one process (rule merge_group): each individual model on its own task (or every
task) and, per named data-free merge, the merged model made and scored. The same files the rules merge and
evaluate_individual write one job each; here torch, the backbone and the tasks' test data are loaded once per
group instead of once per file, which is most of what those small jobs cost.
"""

from __future__ import annotations

from dpmerge.merge.registry import resolve_merge
from dpmerge.stages.common import log, write_parquet
from dpmerge.stages.evaluate import Scorer
from dpmerge.stages.merge import merge

# What one merge entry of --merges may hold: the operator, which vectors it merges, its hyperparameters
MERGE_FIELDS = {"method", "vectors", "params"}


def score_group(*, backbone_spec: dict, base: str, task_vectors: list[str], heads: list[str], data: list[str],
                individual_out: str, merges: dict | None = None, merged: dict | None = None,
                scores: dict | None = None, own_task_only: bool = False,
                require_privacy_record: bool = False) -> None:
    """Score the individual models w0 + tau_t into `individual_out`; for each entry of `merges` ({name: {"method":
    operator, "vectors": "task" | "difference", "params": {...}}}) merge `task_vectors` into `merged[name]` and
    score it into `scores[name]`. Every entry is checked before anything is computed; a merge refused midway
    (e.g. NaN) leaves no file of its own, and Snakemake removes the job's others."""
    merges, merged, scores = merges or {}, merged or {}, scores or {}
    _check_merge_entries(merges, merged, scores)
    if len(task_vectors) != len(heads):
        raise ValueError(f"{len(task_vectors)} --task-vectors for {len(heads)} --heads: give one per task")
    for name, entry in merges.items():
        merge(operator=entry["method"], task_vectors=task_vectors, base=base, out=merged[name],
              vectors=entry.get("vectors", "task"), name=name, params=entry.get("params") or {},
              require_privacy_record=require_privacy_record)
    scorer = Scorer(backbone_spec, heads, data)
    write_parquet(scorer.individual(base, task_vectors, own_task_only), individual_out)
    for name in merges:
        write_parquet(scorer.merged(base, merged[name]), scores[name])
    log(f"[group] {len(task_vectors)} individual models and {len(merges)} merges scored")


def _check_merge_entries(merges: dict, merged: dict, scores: dict) -> None:
    for flag, named in (("--merged", merged), ("--scores", scores)):
        if set(named) != set(merges):
            missing, extra = sorted(set(merges) - set(named)), sorted(set(named) - set(merges))
            raise ValueError(f"{flag} must name one file per merge of --merges {sorted(merges)}"
                             + (f"; missing {missing}" if missing else "") + (f"; not in --merges {extra}" if extra
                                                                              else ""))
    for name, entry in merges.items():
        if not isinstance(entry, dict) or "method" not in entry:
            raise ValueError(f"--merges {name!r}: expected an object with 'method' (the operator), got {entry!r}")
        unknown = sorted(set(entry) - MERGE_FIELDS)
        if unknown:
            raise ValueError(f"--merges {name!r}: unknown field(s) {unknown}; expected {sorted(MERGE_FIELDS)}")
        if not isinstance(entry.get("params", {}), dict):
            raise ValueError(f"--merges {name!r}: 'params' must be an object of hyperparameters")
        try:  # every operator and its hyperparameters checked before the first merge is written
            resolve_merge(entry["method"], entry.get("vectors", "task"), **(entry.get("params") or {}))
        except ValueError as error:
            raise ValueError(f"--merges {name!r}: {error}") from None
