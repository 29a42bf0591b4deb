"""Data-free merge operators over task vectors, streamed tensor by tensor.

Each operator is a pure function: a list of task vectors (mapping parameter name -> tensor of w_t - w0, all
with the same keys and shapes) plus hyperparameters -> one merged task vector. The merged model is
w0 + merged vector. Merging reads only released vectors, so it is post-processing: no privacy cost.

Every operator here is written as a per-tensor rule, optionally preceded by a statistics pass over whole task
vectors (TIES's global top-k threshold). `merge_stream` runs it over a `VectorSource` that yields one tensor of
every task at a time, so peak memory is one merged model plus one tensor per task (plus, for a statistics pass,
one task vector at a time), never T models; `merge` is the same computation over in-memory dicts, bit for bit.

Operators are registered by name in `OPERATORS` with their default hyperparameters; the config and the CLI
look them up there. Beyond the per-tensor rules:
- RegMean and Fisher merging also read per-task data statistics (a `StatisticsSource`, one key at a time);
  merge_statistics.py computes them on public data or privatized.
- Personalized operators (EMR, TALL masks, DTS) store a shared tensor and, per task, light parts from which
  `personal_vector` rebuilds that task's own vector at evaluation.
- Any operator that is not defined on task vectors only can merge difference vectors tau_t - mean(tau)
  (`vectors="difference"`), the result then being mean(tau) + the merged differences.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dpmerge.taskvectors import release_freed_memory

TaskVector = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------------------------- sources


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


class StatisticsSource:
    """Per-task statistics keyed like the task vectors' tensors (a subset of them), read one key at a time."""

    def __init__(self, per_task: list, names: list[str] | None = None):
        self.per_task = per_task  # one mapping key -> tensor per task (dicts or LazySafetensors views)
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
    """Task vectors in safetensors files, read lazily: a tensor is read from disk only when asked for, and
    memory holds only the tensors still referenced (no memory map keeps earlier ones resident)."""

    def __init__(self, paths: list[str | Path], statistics: StatisticsSource | None = None):
        from dpmerge.taskvectors import LazySafetensors

        self.statistics = statistics
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
    # Personalized operators (EMR, TALL masks, DTS) keep per-task parts beside the shared tensor: per_tensor
    # returns (shared, [parts of task t]), parts_layout(shape, dtype, **hyper) gives each part's (dtype, shape)
    # and reconstruct(shared, parts, **hyper) rebuilds task t's vector. Stored as PERSONAL/<t>/<part>/<name>.
    parts_layout: Callable[..., dict] | None = None
    reconstruct: Callable[..., torch.Tensor] | None = None
    task_vectors_only: bool = False  # its reconstruction is defined on task vectors, not difference vectors


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
    """Global top-k: each task vector's magnitude threshold over all its entries, streamed."""
    if topk_scope != "global":
        return None
    numel = _numel(source)
    k = int(round(density * numel))
    if k >= numel:
        return [0.0] * len(source)  # keep everything (|v| >= 0)
    if k <= 0:
        return [float("inf")] * len(source)  # keep nothing
    # The same order statistic as _top_magnitude_threshold's kthvalue(numel - k + 1), 0-based.
    ranked = streamed_order_statistics(lambda: _task_magnitudes(source), [[numel - k]] * len(source))
    return [values[0] for values in ranked]


def _task_magnitudes(source: VectorSource):
    """Chunks for streamed_order_statistics: per tensor name, every task's |tau|, one task read at a time."""
    for key in source.keys():
        yield (source.tensor(index, key).abs() for index in range(len(source)))


def _numel(source: VectorSource) -> int:
    return sum(torch.Size(source.shape(key)).numel() for key in source.keys())


def _order_keys(values: torch.Tensor) -> torch.Tensor:
    """float32 values -> int64 keys in [0, 2^32) with the same order (negative floats' bits reversed)."""
    bits = values.detach().to(torch.float32).reshape(-1).view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -1 - bits, bits + (1 << 31))


def _key_value(key: int) -> float:
    bits = key - (1 << 31) if key >= 1 << 31 else -1 - key
    return float(torch.tensor([bits], dtype=torch.int32).view(torch.float32))


_PIECE = 1 << 20  # keys are formed a million values at a time, bounding the int64 temporaries


def streamed_order_statistics(read_chunks: Callable[[], Iterator], ranks: list[list[int]]):
    """Exact order statistics of S value sequences too large to hold, read twice in chunks.

    `read_chunks()` yields, chunk after chunk, S tensors (a list or a lazy iterable: the next piece of every
    sequence, in sequence order); it is called twice and must yield the same values both times. `ranks[s]` lists 0-based ranks from the smallest
    wanted in sequence s; returns the values at those ranks, as sorting the whole sequence would give.

    Radix selection on order-preserving 32-bit keys of the float32 values: the first pass histograms the high 16
    bits and finds the bucket of every wanted rank, the second histograms the low 16 bits inside those buckets.
    Memory: one chunk plus 2^16 counters per sequence and wanted bucket.
    """
    size = 1 << 16
    high = torch.zeros(len(ranks), size, dtype=torch.int64)
    for chunk in read_chunks():
        for s, values in enumerate(chunk):
            for piece in values.reshape(-1).split(_PIECE):
                high[s] += torch.bincount(_order_keys(piece) >> 16, minlength=size)
    wanted = []  # per sequence: (bucket, rank within the bucket) per rank
    for s, sequence_ranks in enumerate(ranks):
        cumulative = high[s].cumsum(0)
        total = int(cumulative[-1])
        row = []
        for rank in sequence_ranks:
            if not 0 <= rank < total:
                raise ValueError(f"rank {rank} outside a sequence of {total} values")
            bucket = int(torch.searchsorted(cumulative, torch.tensor(rank + 1)))
            row.append((bucket, rank - (int(cumulative[bucket - 1]) if bucket else 0)))
        wanted.append(row)
    low = {(s, bucket): torch.zeros(size, dtype=torch.int64) for s, row in enumerate(wanted) for bucket, _ in row}
    for chunk in read_chunks():
        for s, values in enumerate(chunk):
            for piece in values.reshape(-1).split(_PIECE):
                keys = _order_keys(piece)
                for bucket in {b for b, _ in wanted[s]}:
                    low[s, bucket] += torch.bincount(keys[(keys >> 16) == bucket] & 0xFFFF, minlength=size)
    return [
        [_key_value((bucket << 16) | int(torch.searchsorted(low[s, bucket].cumsum(0), torch.tensor(rank + 1))))
         for bucket, rank in row]
        for s, row in enumerate(wanted)
    ]


def _ties_tensor(key, tensors, thresholds, density, scaling, merge_func, topk_scope):
    if thresholds is None:  # per-tensor top-k
        thresholds = [_top_magnitude_threshold(t.reshape(-1), density) for t in tensors]
    # Trimmed tensors are formed twice, one task at a time (for the elected sign's mass, then for the disjoint
    # merge), rather than stacked: the temporaries stay a few tensors of one name instead of several per task.
    mass = torch.zeros_like(tensors[0])
    for tensor, threshold in zip(tensors, thresholds):
        mass += _keep_above(tensor, threshold)
    elected = torch.sign(mass)
    del mass
    merged = torch.zeros_like(tensors[0])
    agreeing = torch.zeros_like(tensors[0])
    for tensor, threshold in zip(tensors, thresholds):
        trimmed = _keep_above(tensor, threshold)
        agrees = (torch.sign(trimmed) == elected) & (trimmed != 0)
        merged += trimmed.masked_fill_(~agrees, 0)
        agreeing += agrees
        del trimmed, agrees
    if merge_func == "mean":
        merged /= agreeing.clamp_(min=1)
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


# Matrix-shaped operators (WUDI, TSV-M, Iso-C, Iso-CTS) act on each linear layer's weight matrix. Their reference
# code treats exactly the 2-D tensors so; with include_conv, a convolution weight (out, in, kh, kw) is treated as
# the linear map (out, in*kh*kw) it applies to unfolded patches, which is what it is. Every other tensor
# (biases, norms, 1-D parameters) is averaged, as in the reference code.


def _matrix_view(tensor: torch.Tensor, include_conv: bool) -> torch.Tensor | None:
    if tensor.ndim == 2:
        return tensor
    if include_conv and tensor.ndim == 4:
        return tensor.reshape(tensor.shape[0], -1)
    return None


def _include_conv_check(include_conv):
    if not isinstance(include_conv, bool):
        raise ValueError(f"include_conv must be true or false, got {include_conv!r}")


def _mean_of(tensors):
    return torch.stack(tensors).mean(0)


# ---- PCB-merging


_PCB_OUTLIER_FRACTION = 1e-4  # the reference code clamps |tau| to its [1e-4, 1 - 1e-4] quantiles per task


def _pcb_check(ratio, scaling):
    if not 0 < ratio <= 1:
        raise ValueError(f"pcb ratio must be in (0, 1], got {ratio}")


def _pcb_task_balance(tensor: torch.Tensor, total: torch.Tensor, count: int, low: float, high: float):
    """One task's clamped vector and balance scores: intra-balance exp(T * normalised |tau|^2) times
    inter-balance tanh(tau_i * sum_j tau_j), as PCB_merge of the reference code (computed task by task so
    memory holds one task's temporaries at a time)."""
    magnitude = tensor.abs().clamp(low, high)
    clamped = torch.sign(tensor) * magnitude
    intra = torch.exp(count * _normalised(magnitude, low, high) ** 2)
    return clamped, intra * torch.tanh(tensor * total)


def _normalised(values, low: float, high: float):
    """(v - min) / (max - min) with one task's bounds; 0 where they are equal (the reference divides by 0)."""
    if high > low:
        return (values - low) / (high - low)
    return torch.zeros_like(values)


def _pcb_statistics(source: VectorSource, ratio, scaling):
    """Per task: the clamp bounds of |tau| and of the balance scores, each an exact quantile over the whole
    flattened task vector (as the reference sorts it), computed by streamed radix selection."""
    numel = _numel(source)
    count = len(source)
    magnitude_ranks = [int(numel * _PCB_OUTLIER_FRACTION), int(numel * (1 - _PCB_OUTLIER_FRACTION) - 1)]

    bounds = streamed_order_statistics(lambda: _task_magnitudes(source), [magnitude_ranks] * count)
    low = [b[0] for b in bounds]
    high = [b[1] for b in bounds]

    def balance_scores():
        for key in source.keys():
            tensors = source.tensors(key)
            total = torch.stack(tensors).sum(0)
            yield (_pcb_task_balance(t, total, count, low[i], high[i])[1] for i, t in enumerate(tensors))

    score_ranks = [int(numel * (1 - ratio)), numel - 1]
    score_bounds = streamed_order_statistics(balance_scores, [score_ranks] * count)
    return low, high, [b[0] for b in score_bounds], [b[1] for b in score_bounds]


def _pcb_tensor(key, tensors, stats, ratio, scaling):
    low, high, score_low, score_high = stats
    total = torch.stack(tensors).sum(0)
    numerator = torch.zeros_like(total)
    denominator = torch.zeros_like(total)
    for i, tensor in enumerate(tensors):
        clamped, scores = _pcb_task_balance(tensor, total, len(tensors), low[i], high[i])
        weight = _normalised(scores.clamp(score_low[i], score_high[i]), score_low[i], score_high[i])
        numerator += clamped * weight
        denominator += weight
    return scaling * numerator / denominator.clamp(min=1e-12)


# ---- WUDI-merging


def _wudi_check(iterations, lr, scaling, include_conv):
    if not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"wudi iterations must be a non-negative integer, got {iterations!r}")
    if not lr > 0:
        raise ValueError(f"wudi lr must be positive, got {lr}")
    _include_conv_check(include_conv)


def wudi_solve(matrices: list[torch.Tensor], iterations: int = 300, lr: float = 1e-5):
    """min_tau sum_i ||(tau - tau_i) tau_i^T||_F^2 / ||tau_i||_F^2 by Adam from tau = sum_i tau_i.

    Returns (tau, losses) with the loss before every step and after the last. The gradient is computed in
    closed form, 2 (tau A - B) with A = sum_i tau_i^T tau_i / ||tau_i||^2 and B = sum_i tau_i tau_i^T tau_i /
    ||tau_i||^2 formed once, so a step costs one (out x in) @ (in x in) product instead of T (out x in x out)
    products and their backward; the iterates equal autograd's on the same loss up to rounding (tested).
    A task vector with zero norm contributes no term (the reference would divide by zero). Memory: the T
    matrices (one tensor per task), A, B and Adam's two moments.
    """
    # A, B and the constant are accumulated one task at a time: T (in x in) Grams at once would be 8 x 38 MB
    # for ViT-B/32's fc2, more than the task vectors themselves.
    a = torch.zeros(matrices[0].shape[1], matrices[0].shape[1], dtype=matrices[0].dtype)
    b = torch.zeros_like(matrices[0])
    constant = torch.zeros((), dtype=matrices[0].dtype)
    for matrix in matrices:
        norm = matrix.pow(2).sum()
        if norm == 0:
            continue
        gram = matrix.T @ matrix
        projected = matrix @ gram
        a.add_(gram / norm)
        b.add_(projected / norm)
        constant += (projected * matrix).sum() / norm
        del gram, projected
    start = matrices[0].clone()
    for matrix in matrices[1:]:
        start.add_(matrix)
    tau = torch.nn.Parameter(start)
    optimizer = torch.optim.Adam([tau], lr=lr, weight_decay=0)
    losses = []
    with torch.no_grad():
        for _ in range(iterations + 1):
            tau_a = tau @ a
            losses.append(float((tau_a * tau).sum() - 2 * (tau * b).sum() + constant))
            if len(losses) > iterations:
                break
            tau.grad = 2 * (tau_a - b)
            optimizer.step()
    return tau.detach(), losses


def _wudi_tensor(key, tensors, stats, iterations, lr, scaling, include_conv):
    matrices = [_matrix_view(t, include_conv) for t in tensors]
    if matrices[0] is None:
        return scaling * _mean_of(tensors)
    merged, _ = wudi_solve([m.float() for m in matrices], iterations, lr)
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


# ---- Task singular vectors (TSV-M) and isotropic merging (Iso-C, Iso-CTS)


def _svd_check(scaling, include_conv, **_):
    _include_conv_check(include_conv)


def _polar(matrix: torch.Tensor) -> torch.Tensor:
    """The orthogonal factor U V^T of matrix = U S V^T (closest matrix with orthonormal columns/rows)."""
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    return u @ vh


def _tsvm_tensor(key, tensors, stats, scaling, include_conv):
    matrices = [_matrix_view(t, include_conv) for t in tensors]
    count = len(tensors)
    rank = min(matrices[0].shape) // count if matrices[0] is not None else 0
    if rank == 0:  # not a matrix, or fewer singular directions than tasks: averaged
        return scaling * _mean_of(tensors)
    out_dim, in_dim = matrices[0].shape
    width = min(out_dim, in_dim)
    u_all = torch.zeros(out_dim, width)
    s_all = torch.zeros(width)
    vh_all = torch.zeros(width, in_dim)
    for i, matrix in enumerate(matrices):
        u, s, vh = torch.linalg.svd(matrix.float(), full_matrices=False)
        u_all[:, i * rank:(i + 1) * rank] = u[:, :rank]
        s_all[i * rank:(i + 1) * rank] = s[:rank]
        vh_all[i * rank:(i + 1) * rank] = vh[:rank]
    merged = _polar(u_all) @ torch.diag(s_all) @ _polar(vh_all)
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


def _iso_c_tensor(key, tensors, stats, scaling, include_conv):
    summed = _matrix_view(torch.stack(tensors).sum(0), include_conv)
    if summed is None:
        return scaling * _mean_of(tensors)
    u, s, vh = torch.linalg.svd(summed.float(), full_matrices=False)
    merged = s.mean() * (u @ vh)  # the spectrum flattened to its mean: every direction equally scaled
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


def _iso_cts_check(scaling, common_space_fraction, include_conv):
    if not 0 <= common_space_fraction <= 1:
        raise ValueError(f"iso_cts common_space_fraction must be in [0, 1], got {common_space_fraction}")
    _include_conv_check(include_conv)


def _iso_cts_tensor(key, tensors, stats, scaling, common_space_fraction, include_conv):
    matrices = [_matrix_view(t, include_conv) for t in tensors]
    if matrices[0] is None:
        return scaling * _mean_of(tensors)
    matrices = [m.float() for m in matrices]
    count = len(matrices)
    width = min(matrices[0].shape)
    # Common subspace from the sum's top directions; the rest split equally between tasks (reference sizing).
    common = int(width * common_space_fraction)
    common = width - round((width - common) / count) * count
    per_task = (width - common) // count
    u, s, vh = torch.linalg.svd(torch.stack(matrices).sum(0), full_matrices=False)
    u_common, s_common, vh_common = u[:, :common], s[:common], vh[:common]
    u_all, s_all, vh_all = torch.zeros_like(u), torch.zeros_like(s), torch.zeros_like(vh)
    for i, matrix in enumerate(matrices):
        specific = matrix - u_common @ (u_common.T @ matrix)  # task's part outside the common subspace
        u_t, s_t, vh_t = torch.linalg.svd(specific, full_matrices=False)
        u_all[:, i * per_task:(i + 1) * per_task] = u_t[:, :per_task]
        s_all[i * per_task:(i + 1) * per_task] = s_t[:per_task]
        vh_all[i * per_task:(i + 1) * per_task] = vh_t[:per_task]
    start = count * per_task
    u_all[:, start:start + common] = u_common
    s_all[start:start + common] = s_common
    vh_all[start:start + common] = vh_common
    merged = s_all.mean() * (_polar(u_all) @ _polar(vh_all))
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


# ---- Consensus task arithmetic (TALL masks)


def _consensus_check(scaling, tall_mask_lambda, min_agreement):
    if not tall_mask_lambda >= 0:
        raise ValueError(f"consensus tall_mask_lambda must be >= 0, got {tall_mask_lambda}")
    if not isinstance(min_agreement, int) or min_agreement < 0:
        raise ValueError(f"consensus min_agreement must be a non-negative integer, got {min_agreement!r}")


def tall_masks(tensors: list[torch.Tensor], tall_mask_lambda: float, summed: torch.Tensor | None = None):
    """TALL masks (Wang et al., 2024), one per task, made lazily: entry j matters to task t if
    |tau_t| > lambda |tau_MTL - tau_t|, with tau_MTL = sum_t tau_t, i.e. the task's own update outweighs what the
    multi-task vector adds on top of it."""
    summed = torch.stack(tensors).sum(0) if summed is None else summed
    return (t.abs() > tall_mask_lambda * (summed - t).abs() for t in tensors)


def _consensus_tensor(key, tensors, stats, scaling, tall_mask_lambda, min_agreement):
    summed = torch.stack(tensors).sum(0)
    agreement = torch.zeros(summed.shape, dtype=torch.int32)
    for mask in tall_masks(tensors, tall_mask_lambda, summed):  # one task's temporaries at a time
        agreement += mask
    return scaling * torch.where(agreement >= min_agreement, summed, torch.zeros_like(summed))


# ---- Personalized merging: a shared tensor plus light per-task parts, one model per task at evaluation

PERSONAL = "personal"


def _mask_layout(shape, dtype, **_):
    return {"mask": (torch.uint8, tuple(shape))}


def _emr_statistics(source: VectorSource):
    """Per-task rescalers lambda_t = sum|tau_t| / sum|M_t * tau_uni| over the whole vector (streamed)."""
    own = torch.zeros(len(source), dtype=torch.float64)
    kept = torch.zeros(len(source), dtype=torch.float64)
    for key in source.keys():
        tensors = source.tensors(key)
        unified, masks = _emr_unified(tensors)
        own += torch.stack([t.double().abs().sum() for t in tensors])
        kept += torch.stack([(unified * m).double().abs().sum() for m in masks])
    return [float(o / k) if k > 0 else 0.0 for o, k in zip(own, kept)]


def _emr_unified(tensors):
    """EMR's elect step: sign of the sum, then per entry the largest |tau_t| among tasks of that sign; masks
    M_t = (tau_t * tau_uni > 0)."""
    sign = torch.sign(torch.stack(tensors).sum(0))
    magnitude = torch.zeros_like(sign)
    for t in tensors:  # one task's temporaries at a time
        magnitude = torch.maximum(magnitude, torch.where(torch.sign(t) == sign, t.abs(), torch.zeros_like(t)))
    unified = sign * magnitude
    return unified, (t * unified > 0 for t in tensors)


def _emr_tensor(key, tensors, rescalers):
    unified, masks = _emr_unified(tensors)
    parts = [{"mask": m.to(torch.uint8), "scale": torch.tensor(r, dtype=tensors[0].dtype)}
             for m, r in zip(masks, rescalers)]
    return unified, parts


def _emr_layout(shape, dtype, **_):
    return {"mask": (torch.uint8, tuple(shape)), "scale": (dtype, ())}


def _emr_reconstruct(shared, parts):
    return parts["scale"] * parts["mask"].to(shared.dtype) * shared


def _tall_tensor(key, tensors, stats, tall_mask_lambda):
    summed = torch.stack(tensors).sum(0)
    return summed, [{"mask": m.to(torch.uint8)} for m in tall_masks(tensors, tall_mask_lambda, summed)]


def _tall_check(tall_mask_lambda):
    if not tall_mask_lambda >= 0:
        raise ValueError(f"tall_masks tall_mask_lambda must be >= 0, got {tall_mask_lambda}")


def _mask_reconstruct(shared, parts, **_):
    return parts["mask"].to(shared.dtype) * shared


# DTS: per task, truncated SVD (a fraction r of the singular values) with 2-bit codes for U and V: sign, and
# above/below the median magnitude of that sign; each of the four groups is decoded as its mean |value|.


def _dts_check(rank_fraction, include_conv=True):
    if not 0 < rank_fraction <= 1:
        raise ValueError(f"dts rank_fraction must be in (0, 1], got {rank_fraction}")
    _include_conv_check(include_conv)


def _dts_rank(shape, rank_fraction):
    return max(1, int(round(rank_fraction * min(shape[0], int(torch.Size(shape[1:]).numel())))))


def _dts_layout(shape, dtype, rank_fraction, include_conv):
    if len(shape) == 2 or (include_conv and len(shape) == 4):
        rows, cols = shape[0], int(torch.Size(shape[1:]).numel())
        k = _dts_rank(shape, rank_fraction)
        return {"u_codes": (torch.uint8, (rows, k)), "u_scales": (dtype, (4,)), "s": (dtype, (k,)),
                "v_codes": (torch.uint8, (k, cols)), "v_scales": (dtype, (4,))}
    return {"codes": (torch.uint8, tuple(shape)), "scales": (dtype, (4,))}


def dts_quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """2-bit codes (0/1: positive small/large, 2/3: negative small/large, split at the median magnitude of each
    sign) and the four groups' mean |value| (the L2-optimal scale of each group)."""
    flat = values.reshape(-1)
    codes = torch.zeros(flat.shape, dtype=torch.uint8)
    scales = torch.zeros(4, dtype=values.dtype)
    for base, chosen in ((0, flat > 0), (2, flat < 0)):
        magnitudes = flat[chosen].abs()
        if magnitudes.numel() == 0:
            continue
        large = magnitudes > magnitudes.median()
        group = torch.full(magnitudes.shape, base, dtype=torch.uint8) + large.to(torch.uint8)
        codes[chosen] = group
        for offset in (0, 1):
            members = magnitudes[group == base + offset]
            if members.numel():
                scales[base + offset] = members.mean()
    codes[flat == 0] = 0  # zeros decode to the smallest positive group: 2 bits cannot say "zero"
    return codes.reshape(values.shape), scales


def dts_dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    signs = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=scales.dtype)
    return (signs * scales)[codes.long()]


def _dts_tensor(key, tensors, stats, rank_fraction, include_conv):
    parts = []
    for t in tensors:
        matrix = _matrix_view(t, include_conv)
        if matrix is None:
            codes, scales = dts_quantize(t)
            parts.append({"codes": codes, "scales": scales})
            continue
        k = _dts_rank(t.shape, rank_fraction)
        u, s, vh = torch.linalg.svd(matrix.float(), full_matrices=False)
        u_codes, u_scales = dts_quantize(u[:, :k])
        v_codes, v_scales = dts_quantize(vh[:k])
        dtype = t.dtype
        parts.append({"u_codes": u_codes, "u_scales": u_scales.to(dtype), "s": s[:k].to(dtype),
                      "v_codes": v_codes, "v_scales": v_scales.to(dtype)})
    return torch.zeros_like(tensors[0]), parts


def _dts_reconstruct(shared, parts, rank_fraction, include_conv):
    if "codes" in parts:
        return shared + dts_dequantize(parts["codes"], parts["scales"])
    u = dts_dequantize(parts["u_codes"], parts["u_scales"])
    vh = dts_dequantize(parts["v_codes"], parts["v_scales"])
    return shared + ((u * parts["s"]) @ vh).reshape(shared.shape)


def part_bits(operator: str, shape, dtype, **hyperparameters) -> int:
    """Deployment storage of one task's parts of one tensor, in bits (masks 1 bit, DTS codes 2 bits per entry,
    scalars at the tensor's precision)."""
    spec, hyper = _resolve(operator, hyperparameters)
    bits = 0
    float_bits = torch.empty((), dtype=dtype).element_size() * 8
    for name, (part_dtype, part_shape) in spec.parts_layout(shape, dtype, **hyper).items():
        count = int(torch.Size(part_shape).numel())
        bits += count * (1 if name == "mask" else 2 if part_dtype == torch.uint8 else float_bits)
    return bits


# ---- RegMean and Fisher merging (need per-task data statistics; see merge_statistics.py for their privacy)


def _needs(source: VectorSource, what: str, operator: str):
    if source.statistics is None:
        raise ValueError(f"{operator} needs per-task {what} (dpmerge statistics); none were given")
    if len(source.statistics.per_task) != len(source):
        raise ValueError(f"{operator}: {len(source.statistics.per_task)} tasks' {what} for {len(source)} task vectors")
    return source.statistics


def _regmean_check(reduce_non_diagonal_ratio):
    if not 0 <= reduce_non_diagonal_ratio <= 1:
        raise ValueError(f"regmean reduce_non_diagonal_ratio must be in [0, 1], got {reduce_non_diagonal_ratio}")


def _regmean_statistics(source, reduce_non_diagonal_ratio):
    return _needs(source, "Gram matrices", "regmean")


def regmean_solve(matrices, grams, reduce_non_diagonal_ratio: float):
    """argmin_W sum_i ||X_i W^T - X_i W_i^T||^2 = (sum_i W_i G_i)(sum_i G_i)^+ with G_i = X_i^T X_i, after
    shrinking each G_i's off-diagonal entries by the ratio (RegMean's regularisation; 1 = none). Exact on task
    vectors: w0 cancels because (sum G_i)(sum G_i)^+ acts as the identity on their row space. The
    pseudo-inverse keeps privatized (possibly indefinite) or rank-deficient Grams well defined.

    `matrices` and `grams` may be generators: one task's W_i and G_i are held at a time, and the pseudo-inverse
    is applied without forming it (weighted_times_pinv), so the float64 work beyond the inputs is a few
    in x in matrices whatever the task count."""
    total = weighted = None
    for matrix, gram in zip(matrices, grams):
        reduced = gram.to(torch.float64, copy=True)  # a copy: the caller's Gram is never modified
        diagonal = reduced.diagonal().clone()
        reduced.mul_(reduce_non_diagonal_ratio).diagonal().add_((1 - reduce_non_diagonal_ratio) * diagonal)
        product = matrix.double() @ reduced
        if total is None:
            total, weighted = reduced, product
        else:
            total.add_(reduced)
            weighted.add_(product)
        del reduced, product, matrix, gram
        release_freed_memory()  # in x in float64 temporaries per task; keep them from piling up in the heap
    operands = [weighted, total]
    del weighted, total
    return weighted_times_pinv(operands)


def weighted_times_pinv(operands: list[torch.Tensor]) -> torch.Tensor:
    """weighted @ pinv(total) for operands = [weighted, total] with `total` symmetric. The list is emptied so
    each operand is freed as soon as it is no longer needed (ViT-L/14's 4096-wide Grams are 134 MB in float64).

    When `total` is safely positive definite (Cholesky succeeds and its smallest pivot is above
    torch.linalg.pinv's cutoff n * eps * max diagonal) the pseudo-inverse is the inverse, applied by two
    triangular solves: no workspace beyond the factor. Otherwise (privatized Grams can be indefinite, a dead
    input unit makes them singular) the pseudo-inverse comes from one eigendecomposition with pinv's cutoff."""
    weighted, total = operands
    operands.clear()
    width = total.shape[0]
    cutoff = width * torch.finfo(total.dtype).eps
    release_freed_memory()
    factor, info = torch.linalg.cholesky_ex(total)
    if int(info) == 0 and factor.diagonal().square().min() > cutoff * total.diagonal().abs().max():
        del total
        # W T^{-1} = ((L L^T)^{-1} W^T)^T; both solves overwrite nothing the caller keeps
        solved = torch.linalg.solve_triangular(factor, weighted.T, upper=False)
        del weighted
        solved = torch.linalg.solve_triangular(factor.T, solved, upper=True)
        return solved.T
    del factor
    eigenvalues, eigenvectors = torch.linalg.eigh(total)
    del total
    threshold = eigenvalues.abs().max() * cutoff
    inverse = torch.where(eigenvalues.abs() > threshold, 1 / eigenvalues, torch.zeros_like(eigenvalues))
    projected = weighted @ eigenvectors
    del weighted
    return projected.mul_(inverse) @ eigenvectors.T


def _regmean_tensor(key, tensors, statistics, reduce_non_diagonal_ratio):
    if key not in statistics.keys():  # not a linear layer's weight: averaged
        return _mean_of(tensors)
    width = tensors[0].reshape(tensors[0].shape[0], -1).shape[1]

    def grams():
        for index, name in enumerate(statistics.names):
            gram = statistics.tensor(index, key)
            if tuple(gram.shape) != (width, width):
                raise ValueError(f"{name}: Gram of {key!r} has shape {tuple(gram.shape)}, the weight needs "
                                 f"({width}, {width})")
            yield gram

    matrices = (t.reshape(t.shape[0], -1) for t in tensors)
    merged = regmean_solve(matrices, grams(), reduce_non_diagonal_ratio)
    return merged.reshape(tensors[0].shape).to(tensors[0].dtype)


def _fisher_check(normalize_fisher_weight, minimal_fisher_weight):
    if not isinstance(normalize_fisher_weight, bool):
        raise ValueError(f"fisher normalize_fisher_weight must be true or false, got {normalize_fisher_weight!r}")
    if not minimal_fisher_weight >= 0:
        raise ValueError(f"fisher minimal_fisher_weight must be >= 0, got {minimal_fisher_weight}")


def _fisher_statistics(source, normalize_fisher_weight, minimal_fisher_weight):
    """The Fisher source, and each task's global L2 norm of its Fisher (streamed) when normalising."""
    statistics = _needs(source, "Fisher information", "fisher")
    missing = sorted(set(source.keys()) - statistics.keys())
    if missing:
        raise ValueError(f"fisher: the Fisher statistics lack tensors the task vectors have: {missing[:5]}")
    norms = None
    if normalize_fisher_weight:
        squares = torch.zeros(len(source), dtype=torch.float64)
        for key in source.keys():
            for index in range(len(source)):
                squares[index] += statistics.tensor(index, key).double().square().sum()
        norms = squares.sqrt().tolist()
    return statistics, norms


def _fisher_tensor(key, tensors, stats, normalize_fisher_weight, minimal_fisher_weight):
    statistics, norms = stats
    numerator = torch.zeros_like(tensors[0])
    denominator = torch.zeros_like(tensors[0])
    for index, (tensor, name) in enumerate(zip(tensors, statistics.names)):  # one task's Fisher at a time
        fisher_tensor = statistics.tensor(index, key)
        if fisher_tensor.shape != tensor.shape:
            raise ValueError(f"{name}: Fisher of {key!r} has shape {tuple(fisher_tensor.shape)}, "
                             f"the tensor has {tuple(tensor.shape)}")
        if norms is not None and norms[index] > 0:
            fisher_tensor = fisher_tensor / norms[index]
        weight = fisher_tensor.to(tensor.dtype) + minimal_fisher_weight
        numerator += weight * tensor
        denominator += weight
    return numerator / denominator


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
    "pcb": Operator(
        _pcb_tensor,
        {"ratio": 0.05, "scaling": 1.2},
        "Du et al., NeurIPS 2024 (PCB-merging, without the evolutionary search of the coefficients)",
        statistics=_pcb_statistics,
        check=_pcb_check,
    ),
    "wudi": Operator(
        _wudi_tensor,
        {"iterations": 300, "lr": 1e-5, "scaling": 1.0, "include_conv": True},
        "Cheng et al., ICML 2025 (WUDI-merging)",
        check=_wudi_check,
    ),
    "tsv_m": Operator(
        _tsvm_tensor,
        {"scaling": 1.0, "include_conv": True},
        "Gargiulo et al., CVPR 2025 (Task Singular Vectors, TSV-Merge)",
        check=_svd_check,
    ),
    "iso_c": Operator(
        _iso_c_tensor,
        {"scaling": 1.0, "include_conv": True},
        "Marczak et al., ICML 2025 (Iso-C, isotropic merging in the common subspace)",
        check=_svd_check,
    ),
    "iso_cts": Operator(
        _iso_cts_tensor,
        {"scaling": 1.0, "common_space_fraction": 0.8, "include_conv": True},
        "Marczak et al., ICML 2025 (Iso-CTS, common and task-specific subspaces)",
        check=_iso_cts_check,
    ),
    "regmean": Operator(
        _regmean_tensor,
        {"reduce_non_diagonal_ratio": 0.95},
        "Jin et al., ICLR 2023 (RegMean)",
        statistics=_regmean_statistics,
        check=_regmean_check,
    ),
    "fisher": Operator(
        _fisher_tensor,
        {"normalize_fisher_weight": True, "minimal_fisher_weight": 1e-6},
        "Matena and Raffel, NeurIPS 2022 (Fisher merging)",
        statistics=_fisher_statistics,
        check=_fisher_check,
    ),
    "emr": Operator(
        lambda key, tensors, rescalers: _emr_tensor(key, tensors, rescalers),
        {},
        "Huang et al., NeurIPS 2024 (EMR-merging: elect, mask, rescale; one model per task)",
        statistics=lambda source: _emr_statistics(source),
        parts_layout=_emr_layout,
        reconstruct=lambda shared, parts: _emr_reconstruct(shared, parts),
        task_vectors_only=True,
    ),
    "tall_masks": Operator(
        _tall_tensor,
        {"tall_mask_lambda": 0.6},
        "Wang et al., ICML 2024 (TALL masks: w0 + m_t * sum tau per task)",
        check=_tall_check,
        parts_layout=_mask_layout,
        reconstruct=_mask_reconstruct,
        task_vectors_only=True,
    ),
    "dts": Operator(
        _dts_tensor,
        {"rank_fraction": 0.3, "include_conv": True},
        "DTS (paper-dts-personalized-merging.md): truncated SVD + 2-bit 4-group codes per task; "
        "DTS-T on task vectors, DTS-D with vectors: difference",
        check=_dts_check,
        parts_layout=_dts_layout,
        reconstruct=_dts_reconstruct,
    ),
    "consensus_ta": Operator(
        _consensus_tensor,
        {"scaling": 0.3, "tall_mask_lambda": 0.6, "min_agreement": 2},
        "Wang et al., ICML 2024 (TALL masks, Consensus task arithmetic)",
        check=_consensus_check,
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


VECTOR_KINDS = ("task", "difference")


class DifferenceSource(VectorSource):
    """Difference vectors d_t = theta_t - theta_avg = tau_t - mean_j tau_j (paper-dts-personalized-merging.md,
    "difference vector"): the task-specific residuals around the weight average instead of around w0. Keeps
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


def merge_stream(
    operator: str, source: VectorSource, vectors: str = "task", **hyperparameters
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged task vector tensor) for every parameter, reading one tensor per task at a time.

    vectors="task" merges the task vectors tau_t = theta_t - w0. vectors="difference" merges the difference
    vectors d_t = tau_t - mean_j tau_j instead and returns mean_j tau_j + merged(d), i.e. the merged model
    theta_avg + merged(d), still expressed relative to w0.

    The operator and its hyperparameters are checked now (ValueError naming them); tensors are read and merged
    as the result is iterated.
    """
    spec, hyper = _resolve(operator, hyperparameters)
    if vectors not in VECTOR_KINDS:
        raise ValueError(f"vectors must be one of {', '.join(VECTOR_KINDS)}, got {vectors!r}")
    if vectors == "difference" and spec.task_vectors_only:
        raise ValueError(f"{operator} is defined on task vectors only; use vectors: task")
    if vectors == "difference":
        return _merged_differences(spec, hyper, DifferenceSource(source))
    return _merged_tensors(spec, hyper, source)


@torch.no_grad()
def _merged_tensors(spec: Operator, hyper: dict, source: VectorSource):
    """(name, tensor) in stored order: each shared tensor, then (personalized operators) every task's parts."""
    stats = spec.statistics(source, **hyper) if spec.statistics is not None else None
    for key in source.keys():
        merged = spec.per_tensor(key, source.tensors(key), stats, **hyper)
        if spec.parts_layout is None:
            yield key, merged
            continue
        shared, parts = merged
        yield key, shared
        for index, task_parts in enumerate(parts):
            for name in spec.parts_layout(source.shape(key), shared.dtype, **hyper):
                yield part_key(index, name, key), task_parts[name]


def part_key(task_index: int, part: str, key: str) -> str:
    return f"{PERSONAL}/{task_index}/{part}/{key}"


def is_part(key: str) -> bool:
    return key.startswith(PERSONAL + "/")


def _merged_differences(spec: Operator, hyper: dict, source: DifferenceSource):
    for key, merged in _merged_tensors(spec, hyper, source):
        yield key, merged if is_part(key) else source.mean(key) + merged


def stored_layout(operator: str, layout: dict, tasks: int, **hyperparameters) -> dict:
    """Names, dtypes and shapes a merge stores, in order: `layout` (the vectors' name -> (dtype, shape)) for a
    plain operator; each shared tensor followed by every task's parts for a personalized one."""
    spec, hyper = _resolve(operator, hyperparameters)
    if spec.parts_layout is None:
        return dict(layout)
    stored = {}
    for key, (dtype, shape) in layout.items():
        stored[key] = (dtype, shape)
        for index in range(tasks):
            for name, part in spec.parts_layout(shape, dtype, **hyper).items():
                stored[part_key(index, name, key)] = part
    return stored


def is_personalized(operator: str) -> bool:
    return OPERATORS[operator].parts_layout is not None


def personal_vector(operator: str, shared: dict, parts: dict, task_index: int, **hyperparameters) -> TaskVector:
    """Task `task_index`'s vector from a personalized merge: `shared` maps names to shared tensors (relative to
    w0), `parts` holds the stored parts (names from part_key)."""
    spec, hyper = _resolve(operator, hyperparameters)
    out = {}
    for key, value in shared.items():
        task_parts = {name: parts[part_key(task_index, name, key)]
                      for name in spec.parts_layout(value.shape, value.dtype, **hyper)}
        out[key] = spec.reconstruct(value, task_parts, **hyper)
    return out


# Operators that read per-task data statistics, and which kind (merge_statistics.KINDS).
NEEDS_STATISTICS = {"regmean": "gram", "fisher": "fisher"}


def merge(operator: str, task_vectors: list[TaskVector], vectors: str = "task", statistics=None,
          **hyperparameters) -> TaskVector:
    """Merge in-memory task vectors with a registered operator (the same computation as `merge_stream`).
    `statistics`: per-task dicts of Gram matrices / Fisher diagonals for regmean / fisher."""
    return dict(merge_stream(operator, InMemorySource(task_vectors, statistics=statistics), vectors,
                             **hyperparameters))


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


def pcb(task_vectors, ratio=0.05, scaling=1.2) -> TaskVector:
    """PCB-merging (Du et al., 2024, "Parameter Competition Balancing"), as PCB_merge in its reference code.

    Over each task vector flattened whole: clamp |tau| to its [1e-4, 1 - 1e-4] quantiles; score every entry by
    intra-balance exp(T * norm(|tau|)^2) (its importance within the task) times inter-balance
    tanh(tau_i * sum_j tau_j) (its agreement with the other tasks); keep the top `ratio` fraction of scores
    per task (clamp below at the (1 - ratio) quantile) and min-max normalise them into weights; merge as the
    weighted mean sum_i w_i tau_i / sum_i w_i, times `scaling`. Quantiles are exact, streamed.

    Args:
        ratio: fraction of entries per task that keep a non-zero weight (reference script: 0.05).
        scaling: lambda (reference script: 1.2 for every task before its optional evolutionary search of
            per-task coefficients on validation data, which a data-free merge cannot do).
    """
    return merge("pcb", task_vectors, ratio=ratio, scaling=scaling)


def wudi(task_vectors, iterations=300, lr=1e-5, scaling=1.0, include_conv=True) -> TaskVector:
    """WUDI-merging (Cheng et al., 2025, "Whoever Started the Interference Should End It").

    Per weight matrix, tau minimises sum_i ||(tau - tau_i) tau_i^T||_F^2 / ||tau_i||_F^2 (interference on the
    inputs spanned by each task's own update) by Adam from tau = sum_i tau_i; other tensors are averaged.
    Deterministic: no random component (start point and steps are fixed by the inputs).

    Args:
        iterations, lr: Adam steps and learning rate (reference code: 300, 1e-5).
        scaling: applied to the merged vector (reference: 1).
        include_conv: also treat convolution weights as (out, in*kh*kw) matrices (the reference has 2-D only).
    """
    return merge("wudi", task_vectors, iterations=iterations, lr=lr, scaling=scaling, include_conv=include_conv)


def tsv_m(task_vectors, scaling=1.0, include_conv=True) -> TaskVector:
    """TSV-Merge (Gargiulo et al., 2025, "Task Singular Vectors"): per weight matrix keep each task's top
    min(out, in) / T singular triplets, concatenate them, orthogonalise the left and right singular vectors
    (polar factor, removing inter-task interference) and recombine; other tensors averaged; times `scaling`
    (alpha, reference 1)."""
    return merge("tsv_m", task_vectors, scaling=scaling, include_conv=include_conv)


def iso_c(task_vectors, scaling=1.0, include_conv=True) -> TaskVector:
    """Iso-C (Marczak et al., 2025, "No Task Left Behind"): per weight matrix, the SVD of sum_t tau_t with every
    singular value replaced by their mean (an isotropic spectrum); other tensors averaged; times `scaling`
    (alpha; FusionBench default 1, the paper tunes it on validation data)."""
    return merge("iso_c", task_vectors, scaling=scaling, include_conv=include_conv)


def iso_cts(task_vectors, scaling=1.0, common_space_fraction=0.8, include_conv=True) -> TaskVector:
    """Iso-CTS (Marczak et al., 2025): like Iso-C, but only `common_space_fraction` of the directions come from
    the sum's top singular vectors; the rest are split equally between tasks, each filled with that task's top
    directions outside the common subspace; then orthogonalised and given an isotropic spectrum."""
    return merge("iso_cts", task_vectors, scaling=scaling, common_space_fraction=common_space_fraction,
                 include_conv=include_conv)


def consensus_ta(task_vectors, scaling=0.3, tall_mask_lambda=0.6, min_agreement=2) -> TaskVector:
    """Consensus task arithmetic (Wang et al., 2024, "Localizing Task Information for Improved Model Merging
    and Compression"): task arithmetic restricted to the entries that at least `min_agreement` tasks' TALL masks
    select (k = 2 in the paper), removing "selfish" (one task) and "catastrophic" (no task) weights.

    Args:
        scaling: task arithmetic's lambda (0.3 as task_arithmetic).
        tall_mask_lambda: the TALL mask threshold (the paper picks it per task on validation data from
            {0.2, ..., 0.6}; data-free, one value for all, FusionBench's TALL default 0.6).
        min_agreement: k.
    """
    return merge("consensus_ta", task_vectors, scaling=scaling, tall_mask_lambda=tall_mask_lambda,
                 min_agreement=min_agreement)


def regmean(task_vectors, grams, reduce_non_diagonal_ratio=0.95) -> TaskVector:
    """RegMean (Jin et al., 2023, "Dataless Knowledge Fusion by Merging Weights of Language Models"): per linear
    layer, the weights minimising the summed squared output difference to every task model on its own inputs,
    in closed form from the Gram matrices of those inputs; other tensors averaged.

    Args:
        grams: per task, {weight name: mean input Gram (in x in)} (merge_statistics.gram_statistics).
        reduce_non_diagonal_ratio: alpha scaling the Grams' off-diagonal entries (FusionBench: 0.95 for CLIP
            vision models, 0.1 in its generic/language configuration).
    """
    return merge("regmean", task_vectors, statistics=grams, reduce_non_diagonal_ratio=reduce_non_diagonal_ratio)


def fisher(task_vectors, fishers, normalize_fisher_weight=True, minimal_fisher_weight=1e-6) -> TaskVector:
    """Fisher merging (Matena and Raffel, 2022): per parameter, the Fisher-weighted mean
    sum_i F_i tau_i / sum_i F_i (= the weighted mean of the fine-tuned weights, minus w0).

    Args:
        fishers: per task, {parameter name: diagonal Fisher} (merge_statistics.fisher_statistics).
        normalize_fisher_weight: divide each task's Fisher by its global L2 norm first (FusionBench default).
        minimal_fisher_weight: added to every weight so coordinates no task informs are averaged.
    """
    return merge("fisher", task_vectors, statistics=fishers, normalize_fisher_weight=normalize_fisher_weight,
                 minimal_fisher_weight=minimal_fisher_weight)
