"""Where merges read task vectors from: one tensor of every task at a time, checked as it is read.

A `VectorSource` holds T task vectors tau_t = w_t - w0 (mapping parameter name -> tensor, all with the same
names, shapes and dtypes) and hands out one tensor of one task at a time, so a streamed merge never holds T
models. `InMemorySource` wraps dicts, `SafetensorsSource` reads files lazily, `DifferenceSource` turns any
source into difference vectors d_t = tau_t - mean_j tau_j (the "difference vector" of Guo et al., "Stay Unique,
Stay Efficient: Preserving Model Personality in Multi-Task Merging", arXiv 2512.01461). A `StatisticsSource`
holds the per-task data statistics RegMean and Fisher merging read (privacy/statistics.py computes them).
Every tensor read is checked finite, and the sources' structures are checked equal, with errors naming the
file and the tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpmerge.artifacts import all_finite
from dpmerge.checkpoints import open_checkpoint

TaskVector = dict[str, torch.Tensor]


class VectorSource:
    """T task vectors with the same parameter names, shapes and dtypes, read one tensor at a time."""
    names: list[str]  # one label per task vector, used in error messages
    # Per-task data statistics for the operators that need them (RegMean Grams, Fisher), or None.
    statistics: "StatisticsSource | None" = None

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


def consume(tensors: list[torch.Tensor]):
    """Each tensor of the list in order, its slot emptied as it is handed out. A per-tensor merge rule gets a
    fresh list from VectorSource.tensors; where it needs each task's tensor once, the list then stops holding
    the tasks already used, and a streamed merge holds fewer than T of them."""
    for index in range(len(tensors)):
        tensor, tensors[index] = tensors[index], None
        yield tensor


class StatisticsSource:
    """Per-task statistics keyed like the task vectors' tensors (a subset of them), read one key at a time."""

    def __init__(self, per_task: list, names: list[str] | None = None):
        self.per_task = per_task  # one mapping key -> tensor per task (dicts or artifacts.SafetensorsFile views)
        self.names = names or [f"statistics of task {i}" for i in range(len(per_task))]
        keys = [set(_keys_of(stats)) for stats in per_task]
        for name, other in zip(self.names[1:], keys[1:]):
            if other != keys[0]:
                raise ValueError(f"{name} covers other tensors than {self.names[0]}: "
                                 f"{sorted(other ^ keys[0])[:5]}")
        self._keys = keys[0]

    def keys(self) -> set[str]:
        return self._keys

    def tensor(self, index: int, key: str) -> torch.Tensor:
        return _checked_finite(_get(self.per_task[index], key), self.names[index], key)


def _keys_of(stats) -> list[str]:
    return list(stats.keys())


def _get(stats, key):
    return stats[key] if isinstance(stats, dict) else stats.get_tensor(key)


class InMemorySource(VectorSource):
    def __init__(self, task_vectors: list[TaskVector], names: list[str] | None = None, statistics=None):
        if not task_vectors:
            raise ValueError("merging needs at least one task vector")
        self.vectors = task_vectors
        self.names = names or [f"task vector {i}" for i in range(len(task_vectors))]
        check_same_structure(self.names, [_structure(v) for v in task_vectors])
        if statistics is not None and not isinstance(statistics, StatisticsSource):
            statistics = StatisticsSource(statistics)
        self.statistics = statistics

    def keys(self) -> list[str]:
        return list(self.vectors[0])

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.vectors[0][key].shape)

    def tensor(self, index: int, key: str) -> torch.Tensor:
        return _checked_finite(self.vectors[index][key], self.names[index], key)


class SafetensorsSource(VectorSource):
    """Task vectors in safetensors files, sharded checkpoints or model folders (checkpoints.open_checkpoint), read
    lazily through the safetensors library (artifacts.SafetensorsFile: headers checked on opening, complete
    reads): a tensor is read from disk only when asked for, and memory holds only the tensors still referenced
    (no memory map keeps earlier ones resident)."""

    def __init__(self, paths: list[str | Path], statistics: StatisticsSource | None = None):

        self.statistics = statistics
        if not paths:
            raise ValueError("merging needs at least one task vector")
        self.names = [str(p) for p in paths]
        self.files = [open_checkpoint(p) for p in paths]
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
    if value.is_floating_point() and not all_finite(value):
        raise ValueError(f"{name}: tensor {key!r} contains NaN or Inf")
    return value


class AtLeastFloat32(VectorSource):
    """The same task vectors, each tensor stored in float16 or bfloat16 read as float32, the precision merges
    compute in: in float16 a rule's small guards (PCB's floor on a sum of weights) round to 0 and its divisions
    to NaN, and a sum over tasks loses its low bits. `stored` hands a result back at the vectors' own precision."""

    LOW_PRECISION = (torch.float16, torch.bfloat16)

    def __init__(self, source: VectorSource):
        self.source = source
        self.names = source.names
        self.statistics = source.statistics
        self._stored_dtypes: dict[str, torch.dtype] = {}

    def keys(self) -> list[str]:
        return self.source.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return self.source.shape(key)

    def tensor(self, index: int, key: str) -> torch.Tensor:
        tensor = self.source.tensor(index, key)
        self._stored_dtypes[key] = tensor.dtype
        return tensor.float() if tensor.dtype in self.LOW_PRECISION else tensor

    def stored(self, tensor: torch.Tensor, key: str) -> torch.Tensor:
        """`tensor`, a result for the vectors' tensor `key` (already read), at the precision they are stored in."""
        dtype = self._stored_dtypes.get(key)
        return tensor.to(dtype) if dtype in self.LOW_PRECISION and tensor.is_floating_point() else tensor


class DifferenceSource(VectorSource):
    """Difference vectors d_t = theta_t - theta_avg = tau_t - mean_j tau_j (DTS's "difference vector", arXiv
    2512.01461): the task-specific residuals around the weight average instead of around w0. Keeps
    only the current name's mean (summed one task at a time) and forms each d_t when it is read, so a
    difference merge holds what a task-vector merge holds plus one tensor."""

    def __init__(self, source: VectorSource):
        self.source = source
        self.statistics = source.statistics
        self.names = [f"{name} (difference vector)" for name in source.names]
        self._key = None
        self._mean = None

    def keys(self) -> list[str]:
        return self.source.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return self.source.shape(key)

    def mean(self, key: str) -> torch.Tensor:
        if key != self._key:
            self._key = self._mean = None  # drop the previous name's mean before summing this one's
            total = None
            for index in range(len(self.source)):
                tensor = self.source.tensor(index, key)
                total = tensor.clone() if total is None else total.add_(tensor)
                del tensor
            self._mean = total.div_(len(self.source))
            self._key = key
        return self._mean

    def tensor(self, index: int, key: str) -> torch.Tensor:
        mean = self.mean(key)
        return self.source.tensor(index, key) - mean
