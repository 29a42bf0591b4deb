"""Data-free merge operators over task vectors.

Each operator is a pure function: a list of task vectors (mapping parameter name -> tensor of w_t - w0, all
with the same keys and shapes) plus hyperparameters -> one merged task vector. The merged model is
w0 + merged vector. Merging reads only released vectors, so it is post-processing: no privacy cost.

Operators are registered by name in `OPERATORS` with their default hyperparameters; the config and the CLI
look them up there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

TaskVector = dict[str, torch.Tensor]


def _check_same_keys(task_vectors: list[TaskVector]) -> list[str]:
    if not task_vectors:
        raise ValueError("merging needs at least one task vector")
    keys = list(task_vectors[0])
    for index, vector in enumerate(task_vectors[1:], start=1):
        if set(vector) != set(keys):
            diff = sorted(set(vector) ^ set(keys))
            raise ValueError(f"task vector {index} has different parameters than task vector 0 (e.g. {diff[:3]})")
        for key in keys:
            if vector[key].shape != task_vectors[0][key].shape:
                raise ValueError(
                    f"task vector {index}: {key!r} has shape {tuple(vector[key].shape)}, "
                    f"task vector 0 has {tuple(task_vectors[0][key].shape)}"
                )
    return keys


@torch.no_grad()
def weight_averaging(task_vectors: list[TaskVector]) -> TaskVector:
    """Weight averaging / model soups (Wortsman et al., 2022): w = mean_t w_t, i.e. tau = mean_t tau_t."""
    keys = _check_same_keys(task_vectors)
    return {key: torch.stack([tv[key] for tv in task_vectors]).mean(0) for key in keys}


@torch.no_grad()
def task_arithmetic(task_vectors: list[TaskVector], scaling: float = 0.3) -> TaskVector:
    """Task arithmetic (Ilharco et al., 2023): tau = scaling * sum_t tau_t.

    Args:
        scaling: lambda; 0.3 is the paper's setting (App. B.3). scaling = 1/T reproduces weight averaging.
    """
    keys = _check_same_keys(task_vectors)
    return {key: scaling * torch.stack([tv[key] for tv in task_vectors]).sum(0) for key in keys}


def _flatten(vector: TaskVector, keys: list[str]) -> torch.Tensor:
    return torch.cat([vector[key].reshape(-1) for key in keys])


def _unflatten(flat: torch.Tensor, like: TaskVector, keys: list[str]) -> TaskVector:
    out, start = {}, 0
    for key in keys:
        numel = like[key].numel()
        out[key] = flat[start : start + numel].reshape(like[key].shape).to(like[key].dtype)
        start += numel
    return out


def _keep_top_magnitude(values: torch.Tensor, density: float) -> torch.Tensor:
    """Zero all but the `density` fraction of entries with largest magnitude (ties at the threshold kept)."""
    k = int(round(density * values.numel()))
    if k >= values.numel():
        return values.clone()
    if k <= 0:
        return torch.zeros_like(values)
    threshold = values.abs().kthvalue(values.numel() - k + 1).values
    return torch.where(values.abs() >= threshold, values, torch.zeros_like(values))


@torch.no_grad()
def ties(
    task_vectors: list[TaskVector],
    density: float = 0.2,
    scaling: float = 1.0,
    merge_func: str = "mean",
    topk_scope: str = "global",
) -> TaskVector:
    """TIES-merging (Yadav et al., 2023): trim, elect sign, disjoint merge.

    1. Trim: keep the top `density` fraction of each task vector's entries by magnitude.
    2. Elect: per coordinate, the sign of the summed trimmed values (the sign carrying more mass).
    3. Disjoint merge: combine only the entries that agree with the elected sign, then multiply by `scaling`.

    Args:
        density: fraction kept in the trim step (paper: 0.2, i.e. top 20%).
        scaling: lambda applied to the merged vector. With merge_func="mean" the TIES paper's lambda = 1 is
            the natural default; FusionBench/AdaMerging's CLIP convention is merge_func="sum" with 0.3.
        merge_func: "mean" (mean over agreeing entries, the TIES paper's disjoint mean) or "sum".
        topk_scope: "global" (threshold over the whole flattened task vector, as the TIES code does) or
            "per_tensor" (threshold within each parameter tensor).
    """
    if not 0 <= density <= 1:
        raise ValueError(f"ties density must be in [0, 1], got {density}")
    if merge_func not in ("mean", "sum"):
        raise ValueError(f"ties merge_func must be 'mean' or 'sum', got {merge_func!r}")
    if topk_scope not in ("global", "per_tensor"):
        raise ValueError(f"ties topk_scope must be 'global' or 'per_tensor', got {topk_scope!r}")
    keys = _check_same_keys(task_vectors)
    if topk_scope == "global":
        trimmed = torch.stack([_keep_top_magnitude(_flatten(tv, keys), density) for tv in task_vectors])
    else:
        trimmed = torch.stack(
            [_flatten({k: _keep_top_magnitude(tv[k].reshape(-1), density) for k in keys}, keys) for tv in task_vectors]
        )
    elected = torch.sign(trimmed.sum(0))
    agrees = (torch.sign(trimmed) == elected) & (trimmed != 0)
    kept = torch.where(agrees, trimmed, torch.zeros_like(trimmed))
    merged = kept.sum(0)
    if merge_func == "mean":
        merged = merged / agrees.sum(0).clamp(min=1)
    return _unflatten(scaling * merged, task_vectors[0], keys)


@dataclass(frozen=True)
class Operator:
    function: Callable[..., TaskVector]
    defaults: dict = field(default_factory=dict)
    citation: str = ""


OPERATORS: dict[str, Operator] = {
    "weight_averaging": Operator(weight_averaging, {}, "Wortsman et al., ICML 2022"),
    "task_arithmetic": Operator(task_arithmetic, {"scaling": 0.3}, "Ilharco et al., ICLR 2023"),
    "ties": Operator(
        ties,
        {"density": 0.2, "scaling": 1.0, "merge_func": "mean", "topk_scope": "global"},
        "Yadav et al., NeurIPS 2023",
    ),
}


def merge(operator: str, task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """Merge with a registered operator; unknown names or hyperparameters raise ValueError naming the known ones."""
    if operator not in OPERATORS:
        raise ValueError(f"unknown merge operator {operator!r}; known operators: {', '.join(sorted(OPERATORS))}")
    spec = OPERATORS[operator]
    unknown = set(hyperparameters) - set(spec.defaults)
    if unknown:
        allowed = ", ".join(sorted(spec.defaults)) or "none"
        raise ValueError(f"merge operator {operator!r} has no hyperparameter {sorted(unknown)}; allowed: {allowed}")
    return spec.function(task_vectors, **{**spec.defaults, **hyperparameters})
