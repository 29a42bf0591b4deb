"""Merge rules that also read per-task data statistics: RegMean (input Gram matrices) and Fisher merging
(diagonal Fisher information). privacy/statistics.py computes the statistics, on public data or privatized.

- RegMean: Jin et al., arXiv 2212.09849 (ICLR 2023): per linear layer, the closed-form least-squares fit to
  every task model's outputs on its own inputs (`regmean_solve`, its pseudo-inverse applied without forming it
  by `weighted_times_pinv`).
- Fisher merging: Matena and Raffel, arXiv 2111.09832 (NeurIPS 2022): per parameter, the Fisher-weighted mean;
  `normalization: reference` normalises as FusionBench's method/fisher_merging/fisher_merging.py does (its
  kernel says how the two differ).

Tensors that are not a linear layer's weight are averaged (merge/matrices.py). Each kernel's docstring states
its operator's mathematics; `IMPLEMENTATIONS` hands them to merge.registry, which pairs them with their specs
(merge.specs).
"""

from __future__ import annotations

import torch

from dpmerge.merge.matrices import mean_of
from dpmerge.merge.sources import VectorSource, consume
from dpmerge.runtime import release_freed_memory

# ---- RegMean

_GRAM_BLOCK = 512  # columns of a Gram converted to float64 at a time: 12.6 MB for a 3072-wide one


def _needs(source: VectorSource, what: str, operator: str):
    if source.statistics is None:
        raise ValueError(f"{operator} needs per-task {what} (dpmerge statistics); none were given")
    if len(source.statistics.per_task) != len(source):
        raise ValueError(f"{operator}: {len(source.statistics.per_task)} tasks' {what} for {len(source)} task vectors")
    return source.statistics


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
    # sum_i W_i R_i with R_i = r G_i + (1 - r) diag(G_i) is r sum_i W_i G_i + (1 - r) sum_i W_i diag(G_i), and
    # sum_i R_i is the same shrinkage of sum_i G_i: each Gram is added to the float64 total as read (no float64
    # copy of it), and multiplied into W_i a block of columns at a time (a float64 copy of one block).
    ratio = reduce_non_diagonal_ratio
    total = weighted = None
    for matrix, gram in zip(matrices, grams):
        matrix = matrix.double()
        if total is None:
            total = torch.zeros(gram.shape, dtype=torch.float64)
            weighted = torch.zeros(matrix.shape, dtype=torch.float64)
        total.add_(gram)
        if ratio != 0:
            for start in range(0, gram.shape[1], _GRAM_BLOCK):
                block = slice(start, start + _GRAM_BLOCK)
                weighted[:, block].addmm_(matrix, gram[:, block].double(), alpha=ratio)
        if ratio != 1:
            weighted.addcmul_(matrix, gram.diagonal().double(), value=1 - ratio)
        del matrix, gram
        release_freed_memory()  # float64 temporaries per task; keep them from piling up in the heap
    diagonal = total.diagonal().clone()
    total.mul_(ratio).diagonal().add_(diagonal, alpha=1 - ratio)
    del diagonal
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
    """RegMean (Jin et al., 2023, "Dataless Knowledge Fusion by Merging Weights of Language Models", arXiv
    2212.09849): per linear layer, the weights minimising the summed squared output difference to every task
    model on its own inputs, in closed form from the Gram matrices of those inputs; other tensors averaged.

    Args:
        grams: per task, {weight name: mean input Gram (in x in)} (privacy.statistics.gram_statistics).
        reduce_non_diagonal_ratio: alpha scaling the Grams' off-diagonal entries (FusionBench: 0.95 for CLIP
            vision models, 0.1 in its generic/language configuration)."""
    if key not in statistics.keys():  # not a linear layer's weight: averaged
        return mean_of(tensors)
    width = tensors[0].reshape(tensors[0].shape[0], -1).shape[1]

    def grams():
        for index, name in enumerate(statistics.names):
            gram = statistics.tensor(index, key)
            if tuple(gram.shape) != (width, width):
                raise ValueError(f"{name}: Gram of {key!r} has shape {tuple(gram.shape)}, the weight needs "
                                 f"({width}, {width})")
            yield gram

    shape, dtype = tensors[0].shape, tensors[0].dtype
    matrices = (t.reshape(t.shape[0], -1) for t in consume(tensors))  # each task's weight freed once used
    merged = regmean_solve(matrices, grams(), reduce_non_diagonal_ratio)
    return merged.reshape(shape).to(dtype)


# ---- Fisher merging


def _fisher_statistics(source, normalize_fisher_weight, minimal_fisher_weight, normalization):
    """The Fisher source and, when normalising, per task the global L2 norm ||F_t|| of its Fisher over every
    tensor (streamed) or, for `normalization: reference`, the coefficient FusionBench multiplies F_t + m by:
    (1 / T) c_t / sum_j c_j with c_t = 1 / (||F_t|| + m)."""
    statistics = _needs(source, "Fisher information", "fisher")
    missing = sorted(set(source.keys()) - statistics.keys())
    if missing:
        raise ValueError(f"fisher: the Fisher statistics lack tensors the task vectors have: {missing[:5]}")
    if not normalize_fisher_weight:
        return statistics, None
    squares = torch.zeros(len(source), dtype=torch.float64)
    for key in source.keys():
        for index in range(len(source)):
            squares[index] += statistics.tensor(index, key).double().square().sum()
    norms = squares.sqrt()
    if normalization == "ours":
        return statistics, norms.tolist()
    inverse = 1 / (norms + minimal_fisher_weight)
    return statistics, (inverse / inverse.sum() / len(source)).tolist()


def _fisher_weight(fisher_tensor, dtype, index, per_task, minimal_fisher_weight, normalization):
    if per_task is None:
        return fisher_tensor.to(dtype) + minimal_fisher_weight
    if normalization == "reference":  # c_t (F + m): the floor enters F and its norm, c_t shares them out
        return per_task[index] * (fisher_tensor.to(dtype) + minimal_fisher_weight)
    if per_task[index] > 0:  # F / ||F|| + m: the floor is added after normalising
        fisher_tensor = fisher_tensor / per_task[index]
    return fisher_tensor.to(dtype) + minimal_fisher_weight


def _fisher_tensor(key, tensors, stats, normalize_fisher_weight, minimal_fisher_weight, normalization):
    """Fisher merging (Matena and Raffel, 2022, "Merging Models with Fisher-Weighted Averaging", arXiv
    2111.09832): per parameter, the Fisher-weighted mean sum_i F_i tau_i / sum_i F_i (= the weighted mean of
    the fine-tuned weights, minus w0).

    Args:
        fishers: per task, {parameter name: diagonal Fisher} (privacy.statistics.fisher_statistics).
        normalize_fisher_weight: divide each task's Fisher by its global L2 norm first (FusionBench default).
        minimal_fisher_weight: m, added to every weight so coordinates no task informs are averaged.
        normalization: where m enters when normalising. "ours": F_t / ||F_t|| + m (the floor is the same for
            every task, so a task whose Fisher is all 0, i.e. that knows nothing, weighs least). "reference": as
            merging_with_fisher_weights in FusionBench's method/fisher_merging/fisher_merging.py (from
            MergeLM), (F_t + m) / (||F_t|| + m) up to a factor common to all tasks; a task whose Fisher is
            all 0 then weighs m / m = 1 everywhere, more than any normalised informative entry. Without
            normalising both are F_t + m."""
    statistics, per_task = stats
    numerator = torch.zeros_like(tensors[0])
    denominator = torch.zeros_like(tensors[0])
    for index, (tensor, name) in enumerate(zip(tensors, statistics.names)):  # one task's Fisher at a time
        fisher_tensor = statistics.tensor(index, key)
        if fisher_tensor.shape != tensor.shape:
            raise ValueError(f"{name}: Fisher of {key!r} has shape {tuple(fisher_tensor.shape)}, "
                             f"the tensor has {tuple(tensor.shape)}")
        weight = _fisher_weight(fisher_tensor, tensor.dtype, index, per_task, minimal_fisher_weight, normalization)
        numerator += weight * tensor
        denominator += weight
    return numerator / denominator


# What merge.registry pairs with each name's OperatorSpec.
IMPLEMENTATIONS = {
    "regmean": {"per_tensor": _regmean_tensor, "statistics": _regmean_statistics},
    "fisher": {"per_tensor": _fisher_tensor, "statistics": _fisher_statistics},
}
