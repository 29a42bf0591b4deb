"""Test-set scores of task models. Rules: evaluate_individual (every task model w0 + tau_t on every task, or
on its own task only) and merge (which scores the merged model it makes on every task; a personalized merge's
per-task models each on its own task).
"""

from __future__ import annotations

from dpmerge.artifacts import load_tensors
from dpmerge.merge.registry import is_part, is_personalized, resolve_merge
from dpmerge.models.base import task_model_weights
from dpmerge.models.evaluation import evaluate_head
from dpmerge.models.spec import backbone_from_spec
from dpmerge.runtime import compute_section
from dpmerge.stages.common import (
    checked_w0,
    load_heads_and_data,
    log,
    merge_label,
    read_task_vectors,
    release_identity,
    write_parquet,
)


def evaluate(*, backbone_spec: dict, base: str, heads: list[str], data: list[str], out: str,
             merged: str | None = None, task_vectors: list[str] | None = None, own_task_only: bool = False) -> None:
    """Score the model(s) on each task's test set with that task's head, one Parquet row per (model, task):
    the merged model if `merged` is given, otherwise each of `task_vectors` (one per head) on every task, or on
    its own task only with `own_task_only`."""
    if not merged and len(task_vectors or []) != len(heads):
        raise ValueError("individual evaluation needs one --task-vectors file per --heads file")
    scorer = Scorer(backbone_spec, heads, data)
    rows = scorer.merged(base, merged) if merged else scorer.individual(base, task_vectors, own_task_only)
    write_parquet(rows, out)


class Scorer:
    """The backbone and every task's head and test data, loaded once; scores any number of models on them (a
    release group's job scores its individual models and each of its merges with one Scorer)."""

    def __init__(self, backbone_spec: dict, heads: list[str], data: list[str]):
        self.network = backbone_from_spec(backbone_spec)
        self.tasks = load_heads_and_data(heads, data)

    def individual(self, base: str, task_vectors: list[str], own_task_only: bool) -> list[dict]:
        """One task vector per head, in the heads' order (evaluate and score_group check the count before loading)."""
        vectors, metas = read_task_vectors(task_vectors)
        w0 = checked_w0(base, metas, task_vectors)
        with compute_section("evaluation", log):
            return _individual_rows(self.network, w0, self.tasks, vectors, metas, own_task_only)

    def merged(self, base: str, merged: str) -> list[dict]:
        model, merged_meta = load_tensors(merged)
        w0 = checked_w0(base, merged_meta=merged_meta, merged_path=merged)
        with compute_section("evaluation", log):
            return _merged_rows(self.network, w0, self.tasks, model, merged_meta)


def _score(network, head, meta: dict, prepared: dict, model_label: str, source_task: str, shown: str) -> dict:
    """One row: the loaded model with `head` on the prepared task's test set."""
    result = evaluate_head(network, head, tuple(prepared["test_features"]), prepared["test_labels"],
                           prepared["task_spec"]["metric"])
    log(f"[evaluate] {model_label} ({shown}) on {prepared['task']}: "
        f"{result['metric']}={result['score']:.2f} loss={result['loss']:.4f}")
    return {**release_identity(meta), "model": model_label, "source_task": source_task, "task": prepared["task"],
            **result}


def _individual_rows(network, w0: dict, tasks: list, vectors: list[dict], metas: list[dict],
                     own_task_only: bool) -> list[dict]:
    # Every task model on every task (with that task's head): the diagonal is the "DP Individual" score,
    # the off-diagonal shows how far one task's encoder serves the others.

    rows = []
    for vector, vector_meta in zip(vectors, metas):
        network.load_top_state(task_model_weights(w0, vector))
        for head, meta, prepared in tasks:
            if own_task_only and prepared["task"] != vector_meta["task"]:
                continue
            rows.append(_score(network, head, meta, prepared, "individual", vector_meta["task"], vector_meta["task"]))
    return rows


def _merged_rows(network, w0: dict, tasks: list, model: dict, merged_meta: dict) -> list[dict]:

    label = merge_label(merged_meta)
    if is_personalized(merged_meta["operator"]):
        return _personalized_rows(network, w0, tasks, model, merged_meta, label)
    network.load_top_state(model)
    return [_score(network, head, meta, prepared, label, "merged", "merged") for head, meta, prepared in tasks]


def _personalized_rows(network, w0: dict, tasks: list, model: dict, merged_meta: dict, label: str) -> list[dict]:
    """Task t is served by its own model w0 + reconstruct(shared, parts of t) (the task is known at test time, as
    EMR, TALL masks and DTS assume); each model is scored on its own task only."""
    merge = resolve_merge(merged_meta["operator"], **merged_meta["hyperparameters"])
    shared = {k: v - w0[k] for k, v in model.items() if not is_part(k)}
    parts = {k: v for k, v in model.items() if is_part(k)}
    order = merged_meta["tasks"]
    rows = []
    for head, meta, prepared in tasks:
        vector = merge.personal_vector(shared, parts, order.index(prepared["task"]))
        network.load_top_state(task_model_weights(w0, vector))
        rows.append(_score(network, head, meta, prepared, label, "merged", "own model"))
    return rows
