"""Data-free merge operators over task vectors, streamed tensor by tensor.

Each operator is a pure function: a list of task vectors (mapping parameter name -> tensor of w_t - w0, all
with the same keys and shapes) plus hyperparameters -> one merged task vector. The merged model is
w0 + merged vector. Merging reads only released vectors, so it is post-processing: no privacy cost.

Every operator here is written as a per-tensor rule, optionally preceded by a statistics pass over whole task
vectors (TIES's global top-k threshold). `merge_stream` runs it over a `VectorSource` that yields one tensor of
every task at a time, so peak memory is one merged model plus one tensor per task (plus, for a statistics pass,
one task vector at a time), never T models; `merge` is the same computation over in-memory dicts, bit for bit.

Operators are registered by name in `OPERATORS` with their default hyperparameters; the config and the CLI
look them up there.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

TaskVector = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------------------------- sources


class VectorSource:
    """T task vectors with the same parameter names, shapes and dtypes, read one tensor at a time."""

    names: list[str]  # one label per task vector, used in error messages

    def keys(self) -> list[str]:
        raise NotImplementedError

    def tensor(self, index: int, key: str) -> torch.Tensor:
        raise NotImplementedError

    def shape(self, key: str) -> tuple[int, ...]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.names)

    def tensors(self, key: str) -> list[torch.Tensor]:
        return [self.tensor(i, key) for i in range(len(self))]

    def whole(self, index: int) -> TaskVector:
        return {key: self.tensor(index, key) for key in self.keys()}


class InMemorySource(VectorSource):
    def __init__(self, task_vectors: list[TaskVector], names: list[str] | None = None):
        if not task_vectors:
            raise ValueError("merging needs at least one task vector")
        self.vectors = task_vectors
        self.names = names or [f"task vector {i}" for i in range(len(task_vectors))]
        check_same_structure(self.names, [_structure(v) for v in task_vectors])

    def keys(self) -> list[str]:
        return list(self.vectors[0])

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.vectors[0][key].shape)

    def tensor(self, index: int, key: str) -> torch.Tensor:
        return _checked_finite(self.vectors[index][key], self.names[index], key)


class SafetensorsSource(VectorSource):
    """Task vectors in safetensors files, read lazily: a tensor is read from disk only when asked for, and
    memory holds only the tensors still referenced (no memory map keeps earlier ones resident)."""

    def __init__(self, paths: list[str | Path]):
        from dpmerge.taskvectors import LazySafetensors

        if not paths:
            raise ValueError("merging needs at least one task vector")
        self.names = [str(p) for p in paths]
        self.files = [LazySafetensors(p) for p in paths]
        structures = [f.structure() for f in self.files]
        check_same_structure(self.names, structures)
        self._keys = list(structures[0])

    def keys(self) -> list[str]:
        return self._keys

    def shape(self, key: str) -> tuple[int, ...]:
        return self.files[0].shape(key)

    def tensor(self, index: int, key: str) -> torch.Tensor:
        return _checked_finite(self.files[index].get_tensor(key), self.names[index], key)


def _structure(vector: TaskVector) -> dict:
    return {key: (tuple(value.shape), str(value.dtype)) for key, value in vector.items()}


def check_same_structure(names: list[str], structures: list[dict]) -> None:
    """Every structure (name -> (shape, dtype)) equals the first; errors name the file and the tensor."""
    first = structures[0]
    for name, structure in zip(names[1:], structures[1:]):
        if missing := sorted(set(first) - set(structure)):
            raise ValueError(f"{name} lacks tensors that {names[0]} has: {missing[:5]}")
        if extra := sorted(set(structure) - set(first)):
            raise ValueError(f"{name} has tensors that {names[0]} lacks: {extra[:5]}")
        for key, (shape, dtype) in first.items():
            if structure[key][0] != shape:
                raise ValueError(f"{name}: tensor {key!r} has shape {structure[key][0]}, {names[0]} has {shape}")
            if structure[key][1] != dtype:
                raise ValueError(f"{name}: tensor {key!r} has dtype {structure[key][1]}, {names[0]} has {dtype}")


def _checked_finite(value: torch.Tensor, name: str, key: str) -> torch.Tensor:
    if value.is_floating_point() and not torch.isfinite(value).all():
        raise ValueError(f"{name}: tensor {key!r} contains NaN or Inf")
    return value


# --------------------------------------------------------------------------------------------- operators


@dataclass(frozen=True)
class Operator:
    """A merge rule: `per_tensor(key, tensors, stats, **hyper)` -> merged tensor, after an optional
    `statistics(source, **hyper)` pass whose result (`stats`) every per-tensor call sees."""

    per_tensor: Callable[..., torch.Tensor]
    defaults: dict = field(default_factory=dict)
    citation: str = ""
    statistics: Callable[..., object] | None = None
    check: Callable[..., None] | None = None  # validates hyperparameters before anything is read


def _weight_averaging_tensor(key, tensors, stats):
    return torch.stack(tensors).mean(0)


def _task_arithmetic_tensor(key, tensors, stats, scaling):
    return scaling * torch.stack(tensors).sum(0)


def _top_magnitude_threshold(values: torch.Tensor, density: float) -> float:
    """|v| threshold keeping the `density` fraction of largest-magnitude entries (ties at it kept)."""
    k = int(round(density * values.numel()))
    if k >= values.numel():
        return 0.0  # keep everything (|v| >= 0)
    if k <= 0:
        return float("inf")  # keep nothing
    return float(values.abs().kthvalue(values.numel() - k + 1).values)


def _keep_above(values: torch.Tensor, threshold: float) -> torch.Tensor:
    if threshold == float("inf"):
        return torch.zeros_like(values)
    return torch.where(values.abs() >= threshold, values, torch.zeros_like(values))


def _ties_check(density, scaling, merge_func, topk_scope):
    if not 0 <= density <= 1:
        raise ValueError(f"ties density must be in [0, 1], got {density}")
    if merge_func not in ("mean", "sum"):
        raise ValueError(f"ties merge_func must be 'mean' or 'sum', got {merge_func!r}")
    if topk_scope not in ("global", "per_tensor"):
        raise ValueError(f"ties topk_scope must be 'global' or 'per_tensor', got {topk_scope!r}")


def _ties_statistics(source: VectorSource, density, scaling, merge_func, topk_scope):
    """Global top-k: each task vector's magnitude threshold over all its entries, streamed (see below)."""
    if topk_scope != "global":
        return None
    return [_streamed_top_magnitude_threshold(source, index, density) for index in range(len(source))]


def _streamed_top_magnitude_threshold(source: VectorSource, index: int, density: float) -> float:
    """Exactly _top_magnitude_threshold over the concatenation of one task vector's tensors, without building it.

    Radix selection on float32 bit patterns (monotone for |v| >= 0): one pass histograms the high 16 bits and
    finds the bucket holding the wanted order statistic, a second pass histograms the low 16 bits inside it.
    Memory: one tensor at a time.
    """
    keys = source.keys()
    numel = sum(torch.Size(source.shape(key)).numel() for key in keys)
    k = int(round(density * numel))
    if k >= numel:
        return 0.0
    if k <= 0:
        return float("inf")
    rank = numel - k + 1  # 1-based rank from the smallest, as kthvalue(numel - k + 1)

    def magnitude_bits(key):
        return source.tensor(index, key).detach().abs().to(torch.float32).reshape(-1).view(torch.int32).to(torch.int64)

    high = torch.zeros(1 << 16, dtype=torch.int64)
    for key in keys:
        high += torch.bincount(magnitude_bits(key) >> 16, minlength=1 << 16)
    cumulative = high.cumsum(0)
    bucket = int(torch.searchsorted(cumulative, torch.tensor(rank)))
    rank -= int(cumulative[bucket - 1]) if bucket else 0
    low = torch.zeros(1 << 16, dtype=torch.int64)
    for key in keys:
        bits = magnitude_bits(key)
        low += torch.bincount(bits[(bits >> 16) == bucket] & 0xFFFF, minlength=1 << 16)
    offset = int(torch.searchsorted(low.cumsum(0), torch.tensor(rank)))
    return float(torch.tensor([(bucket << 16) | offset], dtype=torch.int32).view(torch.float32))


def _ties_tensor(key, tensors, thresholds, density, scaling, merge_func, topk_scope):
    if thresholds is None:  # per-tensor top-k
        thresholds = [_top_magnitude_threshold(t.reshape(-1), density) for t in tensors]
    trimmed = torch.stack([_keep_above(t, threshold) for t, threshold in zip(tensors, thresholds)])
    elected = torch.sign(trimmed.sum(0))
    agrees = (torch.sign(trimmed) == elected) & (trimmed != 0)
    merged = torch.where(agrees, trimmed, torch.zeros_like(trimmed)).sum(0)
    if merge_func == "mean":
        merged = merged / agrees.sum(0).clamp(min=1)
    return (scaling * merged).to(tensors[0].dtype)


def _dare_check(drop_rate, scaling, seed):
    if not 0 <= drop_rate < 1:
        raise ValueError(f"dare drop_rate must be in [0, 1), got {drop_rate}")


def _dare_tensor(key, tensors, stats, drop_rate, scaling, seed):
    kept = []
    for index, t in enumerate(tensors):
        # One generator per (seed, task, tensor name): the masks do not depend on the order tensors are read in.
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index * 7919 + zlib.crc32(key.encode()))
        keep = torch.rand(t.shape, generator=generator) >= drop_rate
        kept.append(torch.where(keep, t / (1.0 - drop_rate), torch.zeros_like(t)))
    return scaling * torch.stack(kept).sum(0)


OPERATORS: dict[str, Operator] = {
    "weight_averaging": Operator(_weight_averaging_tensor, {}, "Wortsman et al., ICML 2022"),
    "task_arithmetic": Operator(_task_arithmetic_tensor, {"scaling": 0.3}, "Ilharco et al., ICLR 2023"),
    "ties": Operator(
        _ties_tensor,
        {"density": 0.2, "scaling": 1.0, "merge_func": "mean", "topk_scope": "global"},
        "Yadav et al., NeurIPS 2023",
        statistics=_ties_statistics,
        check=_ties_check,
    ),
    "dare": Operator(
        _dare_tensor,
        {"drop_rate": 0.5, "scaling": 0.3, "seed": 0},
        "Yu et al., ICML 2024 (DARE + task arithmetic)",
        check=_dare_check,
    ),
}


def _resolve(operator: str, hyperparameters: dict) -> tuple[Operator, dict]:
    if operator not in OPERATORS:
        raise ValueError(f"unknown merge operator {operator!r}; known operators: {', '.join(sorted(OPERATORS))}")
    spec = OPERATORS[operator]
    unknown = set(hyperparameters) - set(spec.defaults)
    if unknown:
        allowed = ", ".join(sorted(spec.defaults)) or "none"
        raise ValueError(f"merge operator {operator!r} has no hyperparameter {sorted(unknown)}; allowed: {allowed}")
    hyper = {**spec.defaults, **hyperparameters}
    if spec.check is not None:
        spec.check(**hyper)
    return spec, hyper


def merge_stream(operator: str, source: VectorSource, **hyperparameters) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged tensor) for every parameter, reading one tensor per task at a time.

    The operator and its hyperparameters are checked now (ValueError naming them); tensors are read and merged
    as the result is iterated.
    """
    spec, hyper = _resolve(operator, hyperparameters)
    return _merged_tensors(spec, hyper, source)


@torch.no_grad()
def _merged_tensors(spec: Operator, hyper: dict, source: VectorSource):
    stats = spec.statistics(source, **hyper) if spec.statistics is not None else None
    for key in source.keys():
        yield key, spec.per_tensor(key, source.tensors(key), stats, **hyper)


def merge(operator: str, task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """Merge in-memory task vectors with a registered operator (the same computation as `merge_stream`)."""
    return dict(merge_stream(operator, InMemorySource(task_vectors), **hyperparameters))


# Pure functions by operator name, for use from Python.
def weight_averaging(task_vectors: list[TaskVector]) -> TaskVector:
    """Weight averaging / model soups (Wortsman et al., 2022): w = mean_t w_t, i.e. tau = mean_t tau_t."""
    return merge("weight_averaging", task_vectors)


def task_arithmetic(task_vectors: list[TaskVector], scaling: float = 0.3) -> TaskVector:
    """Task arithmetic (Ilharco et al., 2023): tau = scaling * sum_t tau_t.

    Args:
        scaling: lambda; 0.3 is the paper's setting (App. B.3). scaling = 1/T reproduces weight averaging.
    """
    return merge("task_arithmetic", task_vectors, scaling=scaling)


def ties(task_vectors, density=0.2, scaling=1.0, merge_func="mean", topk_scope="global") -> TaskVector:
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
    return merge("ties", task_vectors, density=density, scaling=scaling, merge_func=merge_func, topk_scope=topk_scope)


def dare(task_vectors, drop_rate=0.5, scaling=0.3, seed=0) -> TaskVector:
    """DARE (Yu et al., 2024, "Language Models are Super Mario"): drop and rescale, then task arithmetic.

    Each task vector entry is dropped with probability `drop_rate` and the survivors are rescaled by
    1 / (1 - drop_rate), so each task vector is unchanged in expectation; the sparsified vectors are then
    summed and scaled by `scaling` (task arithmetic's lambda). Masks are seeded per (seed, task, tensor).

    Args:
        drop_rate: p in [0, 1); p = 0 is plain task arithmetic.
        scaling: lambda of the task-arithmetic sum (0.3, as task_arithmetic).
        seed: seed of the drop masks.
    """
    return merge("dare", task_vectors, drop_rate=drop_rate, scaling=scaling, seed=seed)
