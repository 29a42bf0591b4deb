"""Merge rules that combine task vectors entry by entry: weight averaging, task arithmetic, TIES, DARE, PCB.

- Weight averaging / model soups: Wortsman et al., arXiv 2203.05482 (ICML 2022).
- Task arithmetic: Ilharco et al., arXiv 2212.04089 (ICLR 2023).
- TIES-Merging: Yadav et al., arXiv 2306.01708 (NeurIPS 2023); its global top-k threshold is an exact streamed
  order statistic (merge/order_statistics.py).
- DARE: Yu et al., arXiv 2311.03099 (ICML 2024), followed by task arithmetic.
- PCB-merging: Du et al., arXiv 2410.02396 (NeurIPS 2024), as PCB_merge in its reference code, without the
  evolutionary search of per-task coefficients.

Each rule is `<name>_tensor(key, tensors, stats, **hyper)`, after an optional `<name>_statistics(source,
**hyper)` pass over whole task vectors. Each kernel's docstring states its operator's mathematics;
`IMPLEMENTATIONS` hands them to merge.registry, which pairs them with their specs (merge.specs).
"""

from __future__ import annotations

import zlib

import torch

from dpmerge.merge.matrices import sum_of
from dpmerge.merge.order_statistics import (
    fixed_threshold,
    streamed_order_statistics,
    task_magnitudes,
    threshold_rank,
    top_magnitude_threshold,
    total_numel,
)
from dpmerge.merge.sources import VectorSource, consume

# ---- weight averaging and task arithmetic


def _weight_averaging_tensor(key, tensors, stats):
    """Weight averaging / model soups (Wortsman et al., 2022, "Model soups", arXiv 2203.05482):
    w = mean_t w_t, i.e. tau = mean_t tau_t."""
    return torch.stack(tensors).mean(0)


def _task_arithmetic_tensor(key, tensors, stats, scaling):
    """Task arithmetic (Ilharco et al., 2023, "Editing Models with Task Arithmetic", arXiv 2212.04089):
    tau = scaling * sum_t tau_t.

    Args:
        scaling: lambda; 0.3 is the paper's setting (App. B.3). scaling = 1/T reproduces weight averaging."""
    return scaling * sum_of(tensors)


# ---- TIES-merging


def _keep_above(values: torch.Tensor, threshold: float) -> torch.Tensor:
    if threshold == float("inf"):
        return torch.zeros_like(values)
    return torch.where(values.abs() >= threshold, values, torch.zeros_like(values))


def _ties_thresholds(source: VectorSource, density, topk_scope, trim):
    """Global top-k: each task vector's magnitude threshold over all its entries, streamed (None: per tensor)."""
    if topk_scope != "global":
        return None
    numel = total_numel(source)
    rank = threshold_rank(numel, density, trim)
    fixed = fixed_threshold(rank, numel)
    if fixed is not None:
        return [fixed] * len(source)
    # The same order statistic as top_magnitude_threshold's kthvalue(rank + 1), over every tensor at once.
    ranked = streamed_order_statistics(lambda: task_magnitudes(source), [[rank]] * len(source))
    return [values[0] for values in ranked]


def _task_thresholds(tensors, thresholds, density, trim):
    if thresholds is not None:
        return thresholds
    return [top_magnitude_threshold(t.reshape(-1), density, trim) for t in tensors]


def _elected(tensors, thresholds) -> torch.Tensor:
    """sign(sum_t trimmed tau_t): the sign carrying more mass, 0 where the trimmed values cancel or are all 0."""
    # Trimmed tensors are formed one task at a time rather than stacked: the temporaries stay a few tensors of
    # one name instead of several per task.
    mass = torch.zeros_like(tensors[0])
    for tensor, threshold in zip(tensors, thresholds):
        mass += _keep_above(tensor, threshold)
    return torch.sign(mass)


def _majority_sign(source: VectorSource, thresholds, density, trim) -> float:
    """The TIES code's resolve_zero_signs: the sign of the sum of every elected sign over the whole vector."""
    total = 0
    for key in source.keys():
        tensors = source.tensors(key)
        elected = _elected(tensors, _task_thresholds(tensors, thresholds, density, trim))
        total += int(elected.sum(dtype=torch.float64))  # exact: float32 would round past 2^24 entries
    return float((total > 0) - (total < 0))


def _ties_statistics(source: VectorSource, density, scaling, merge_func, topk_scope, trim, zero_sign):
    thresholds = _ties_thresholds(source, density, topk_scope, trim)
    majority = _majority_sign(source, thresholds, density, trim) if zero_sign == "majority" else None
    return thresholds, majority


def _ties_tensor(key, tensors, stats, density, scaling, merge_func, topk_scope, trim, zero_sign):
    """TIES-merging (Yadav et al., 2023, "TIES-Merging: Resolving Interference When Merging Models", arXiv
    2306.01708): trim, elect sign, disjoint merge.

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
        trim: how many entries the trim step keeps out of K. "round": round(density * K), the paper's "top k%"
            (so density 0 keeps nothing and 1 everything; the code's extra entry comes from its rank arithmetic).
            "reference": as topk_values_mask of the TIES code (prateeky2806/ties-merging
            src/utils/merge_utils.py, the same in FusionBench's method/ties_merging/ties_merging_utils.py),
            every entry with |v| >= the (K - int(density * K))-th smallest |v|: int(density * K) + 1 entries
            when magnitudes are distinct, more on ties at the threshold, one even at density 0; density 1 is
            refused (the reference's kthvalue(0) fails there).
        zero_sign: where the trimmed values of an entry sum to exactly 0. "none": the paper's sgn(0) = 0
            elects no sign and the entry merges to 0. "majority": as resolve_sign / resolve_zero_signs of the
            TIES code, the entry takes the sign of the sum of every elected sign over the whole vector (one
            extra read) and its disjoint merge keeps the values of that sign, the negative ones if that sum is
            0 too.
        trim="reference" with zero_sign="majority" and topk_scope="global" is the TIES code exactly."""
    thresholds, majority = stats
    thresholds = _task_thresholds(tensors, thresholds, density, trim)
    elected = _elected(tensors, thresholds)
    if majority is not None:
        # As the TIES code: an entry whose trimmed values cancel takes the majority sign, and its disjoint merge
        # keeps the negative values where that sign is 0 too (where(sign > 0, v > 0, v < 0)).
        elected = torch.where(elected == 0, torch.full_like(elected, majority), elected)
    merged = torch.zeros_like(tensors[0])
    agreeing = torch.zeros_like(tensors[0])
    for tensor, threshold in zip(tensors, thresholds):
        trimmed = _keep_above(tensor, threshold)
        if majority is None:
            agrees = (torch.sign(trimmed) == elected) & (trimmed != 0)
        else:
            agrees = torch.where(elected > 0, trimmed > 0, trimmed < 0)
        merged += trimmed.masked_fill_(~agrees, 0)
        agreeing += agrees
        del trimmed, agrees
    if merge_func == "mean":
        merged /= agreeing.clamp_(min=1)
    return (scaling * merged).to(tensors[0].dtype)


# ---- DARE


def _dare_tensor(key, tensors, stats, drop_rate, scaling, seed):
    """DARE (Yu et al., 2024, "Language Models are Super Mario", arXiv 2311.03099): drop and rescale, then task
    arithmetic.

    Each task vector entry is dropped with probability `drop_rate` and the survivors are rescaled by
    1 / (1 - drop_rate), so each task vector is unchanged in expectation; the sparsified vectors are then
    summed and scaled by `scaling` (task arithmetic's lambda). Masks are seeded per (seed, task, tensor).

    Args:
        drop_rate: p in [0, 1); p = 0 is plain task arithmetic.
        scaling: lambda of the task-arithmetic sum (the same default as task_arithmetic's).
        seed: seed of the drop masks."""
    # One task's rescaled survivors at a time, added into the sum: stacking T of them held two more copies of
    # the inputs at the streamed merge's peak (bench/merge_memory.py).
    total = torch.zeros_like(tensors[0])
    for index, t in enumerate(tensors):
        # One generator per (seed, task, tensor name): the masks do not depend on the order tensors are read in.
        generator = torch.Generator().manual_seed(seed * 1_000_003 + index * 7919 + zlib.crc32(key.encode()))
        keep = torch.rand(t.shape, generator=generator) >= drop_rate
        total.add_(torch.where(keep, t / (1.0 - drop_rate), 0.0))
        del keep
    return total.mul_(scaling)


# ---- PCB-merging


_PCB_OUTLIER_FRACTION = 1e-4  # the reference code clamps |tau| to its [1e-4, 1 - 1e-4] quantiles per task


def _pcb_task_balance(tensor: torch.Tensor, total: torch.Tensor, count: int, low: float, high: float):
    """One task's clamped vector and balance scores: intra-balance exp(T * normalised |tau|^2) times
    inter-balance tanh(tau_i * sum_j tau_j), as PCB_merge of the reference code (computed task by task, and in
    place where the reference makes a new tensor per operation, so memory holds four of one task's temporaries;
    the values are the same to the bit)."""
    magnitude = tensor.abs().clamp_(low, high)
    clamped = torch.sign(tensor).mul_(magnitude)
    intra = _normalised(magnitude, low, high)
    del magnitude
    intra.pow_(2).mul_(count).exp_()
    return clamped, intra.mul_(torch.mul(tensor, total).tanh_())


def _normalised(values, low: float, high: float):
    """(v - min) / (max - min) with one task's bounds, as a new tensor; 0 where they are equal (the reference
    divides by 0)."""
    if high > low:
        return (values - low).div_(high - low)
    return torch.zeros_like(values)


def _pcb_statistics(source: VectorSource, ratio, scaling):
    """Per task: the clamp bounds of |tau| and of the balance scores, each an exact quantile over the whole
    flattened task vector (as the reference sorts it), computed by streamed radix selection."""
    numel = total_numel(source)
    count = len(source)
    magnitude_ranks = [int(numel * _PCB_OUTLIER_FRACTION), int(numel * (1 - _PCB_OUTLIER_FRACTION) - 1)]

    bounds = streamed_order_statistics(lambda: task_magnitudes(source), [magnitude_ranks] * count)
    low = [b[0] for b in bounds]
    high = [b[1] for b in bounds]

    def balance_scores():
        for key in source.keys():
            tensors = source.tensors(key)
            total = sum_of(tensors)
            yield (_pcb_task_balance(t, total, count, low[i], high[i])[1] for i, t in enumerate(consume(tensors)))

    score_ranks = [int(numel * (1 - ratio)), numel - 1]
    score_bounds = streamed_order_statistics(balance_scores, [score_ranks] * count)
    return low, high, [b[0] for b in score_bounds], [b[1] for b in score_bounds]


def _pcb_tensor(key, tensors, stats, ratio, scaling):
    """PCB-merging (Du et al., 2024, "Parameter Competition Balancing for Model Merging", arXiv 2410.02396), as
    PCB_merge in its reference code.

    Over each task vector flattened whole: clamp |tau| to its [1e-4, 1 - 1e-4] quantiles; score every entry by
    intra-balance exp(T * norm(|tau|)^2) (its importance within the task) times inter-balance
    tanh(tau_i * sum_j tau_j) (its agreement with the other tasks); keep the top `ratio` fraction of scores
    per task (clamp below at the (1 - ratio) quantile) and min-max normalise them into weights; merge as the
    weighted mean sum_i w_i tau_i / sum_i w_i, times `scaling`. Quantiles are exact, streamed.

    Args:
        ratio: fraction of entries per task that keep a non-zero weight (reference script: 0.05).
        scaling: lambda (reference script: 1.2 for every task before its optional evolutionary search of
            per-task coefficients on validation data, which a data-free merge cannot do)."""
    low, high, score_low, score_high = stats
    total = sum_of(tensors)
    numerator = torch.zeros_like(total)
    denominator = torch.zeros_like(total)
    count = len(tensors)
    for i, tensor in enumerate(consume(tensors)):  # each task's tensor freed after its turn
        clamped, scores = _pcb_task_balance(tensor, total, count, low[i], high[i])
        del tensor
        weight = _normalised(scores.clamp_(score_low[i], score_high[i]), score_low[i], score_high[i])
        del scores
        numerator += clamped.mul_(weight)
        denominator += weight
        del clamped, weight
    return scaling * numerator / denominator.clamp(min=1e-12)


# What merge.registry pairs with each name's OperatorSpec.
IMPLEMENTATIONS = {
    "weight_averaging": {"per_tensor": _weight_averaging_tensor},
    "task_arithmetic": {"per_tensor": _task_arithmetic_tensor},
    "ties": {"per_tensor": _ties_tensor, "statistics": _ties_statistics},
    "dare": {"per_tensor": _dare_tensor},
    "pcb": {"per_tensor": _pcb_tensor, "statistics": _pcb_statistics},
}
