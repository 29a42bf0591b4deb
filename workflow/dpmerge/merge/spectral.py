"""Merge rules on each weight matrix's geometry: WUDI-merging, TSV-M, Iso-C and Iso-CTS.

- WUDI-merging: Cheng et al., arXiv 2503.08099 (ICML 2025): Adam on the interference each task's own inputs
  see (`wudi_solve`, with its gradient in closed form).
- TSV-M: Gargiulo et al., arXiv 2412.00081 (CVPR 2025): every task's top singular triplets, orthogonalised; a
  matrix too small to give every task one is averaged, or zeroed as the reference code does (`short_matrices`).
- Iso-C and Iso-CTS: Marczak et al., arXiv 2502.04959 (ICML 2025): a flat singular spectrum over a common
  subspace, with (CTS) every task's own directions outside it.

Tensors that are not weight matrices are averaged (merge/matrices.py). Each kernel's docstring states its
operator's mathematics; `IMPLEMENTATIONS` hands them to merge.registry, which pairs them with their specs
(merge.specs).
"""

from __future__ import annotations

import torch

from dpmerge.merge.matrices import matrix_view, mean_of, sum_of
from dpmerge.merge.singular import polar, polar_and_spectrum, top_singular
from dpmerge.merge.sources import consume

# ---- WUDI-merging


def wudi_solve(matrices, iterations: int, lr: float):
    """min_tau sum_i ||(tau - tau_i) tau_i^T||_F^2 / ||tau_i||_F^2 by Adam from tau = sum_i tau_i.

    Returns (tau, losses) with the loss before every step and after the last. The gradient is computed in
    closed form, 2 (tau A - B) with A = sum_i tau_i^T tau_i / ||tau_i||^2 and B = sum_i tau_i tau_i^T tau_i /
    ||tau_i||^2 formed once, so a step costs one (out x in) @ (in x in) product instead of T (out x in x out)
    products and their backward; the iterates equal autograd's on the same loss up to rounding (tested).
    A task vector with zero norm contributes no term (the reference would divide by zero). `matrices` (any
    iterable, e.g. merge.sources.consume) is read once, before the steps: memory is then A, B, tau and Adam's
    two moments, whatever the task count.
    """
    # A, B, the constant and the start are accumulated one task at a time: T (in x in) Grams at once would be
    # 8 x 38 MB for ViT-B/32's fc2, more than the task vectors themselves. A grows by addmm_ (no Gram, no scaled
    # copy of it), and tau_i tau_i^T tau_i is formed through the smaller of the two Grams: for a wide matrix (a
    # convolution seen as 768 x 3072) the in x in one was two more 38 MB temporaries at the streamed peak.
    a = b = constant = start = None
    for matrix in matrices:
        if start is None:
            out_dim, in_dim = matrix.shape
            a = torch.zeros(in_dim, in_dim, dtype=matrix.dtype)
            b = torch.zeros_like(matrix)
            constant = torch.zeros((), dtype=matrix.dtype)
            start = matrix.clone()
        else:
            start.add_(matrix)
        norm = matrix.pow(2).sum()
        if norm == 0:
            continue
        a.addmm_(matrix.T, matrix, alpha=float(1 / norm))
        projected = (matrix @ matrix.T) @ matrix if out_dim < in_dim else matrix @ (matrix.T @ matrix)
        b.add_(projected, alpha=float(1 / norm))
        constant += (projected * matrix).sum() / norm
        del projected
    del matrix
    tau = start
    exp_avg, exp_avg_sq = torch.zeros_like(tau), torch.zeros_like(tau)
    losses = []
    for step in range(1, iterations + 2):
        tau_a = tau @ a
        # inner products and an in-place gradient: no matrix-sized temporaries beyond tau A itself
        flat = tau.reshape(-1)
        losses.append(float(torch.dot(tau_a.reshape(-1), flat) - 2 * torch.dot(flat, b.reshape(-1)) + constant))
        if len(losses) > iterations:
            break
        _adam_step(tau, tau_a.sub_(b).mul_(2), exp_avg, exp_avg_sq, step, lr)
        del tau_a
    return tau, losses


def _adam_step(parameter, grad, exp_avg, exp_avg_sq, step: int, lr: float, betas=(0.9, 0.999), eps=1e-8):
    """One step of torch.optim.Adam (no weight decay, no AMSGrad), as its single-tensor CPU code computes it, so
    the iterates are torch's to the bit (tested). torch.optim's first step imports torch._dynamo and SymPy,
    67 MB resident for the rest of a merge (WUDI's streamed peak was 1.64 x one model)."""
    beta1, beta2 = betas
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denominator = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    parameter.addcdiv_(exp_avg, denominator, value=-step_size)


def _wudi_tensor(key, tensors, stats, iterations, lr, scaling, include_conv):
    """WUDI-merging (Cheng et al., 2025, "Whoever Started the Interference Should End It", arXiv 2503.08099).

    Per weight matrix, tau minimises sum_i ||(tau - tau_i) tau_i^T||_F^2 / ||tau_i||_F^2 (interference on the
    inputs spanned by each task's own update) by Adam from tau = sum_i tau_i; other tensors are averaged.
    Deterministic: no random component (start point and steps are fixed by the inputs).

    Args:
        iterations, lr: Adam steps and learning rate (reference code: 300, 1e-5).
        scaling: applied to the merged vector (reference: 1).
        include_conv: also treat convolution weights as (out, in*kh*kw) matrices (the reference has 2-D only)."""
    if matrix_view(tensors[0], include_conv) is None or len(tensors) == 1:
        # One task: tau_1 is the minimiser (zero interference) and Adam's start; the reference returns it as is,
        # where our float32 steps from a zero gradient would drift by rounding
        return scaling * mean_of(tensors)
    shape, dtype = tensors[0].shape, tensors[0].dtype
    merged, _ = wudi_solve((matrix_view(t, include_conv).float() for t in consume(tensors)), iterations, lr)
    return scaling * merged.reshape(shape).to(dtype)


# ---- Task singular vectors (TSV-M) and isotropic merging (Iso-C, Iso-CTS)


def _tsvm_tensor(key, tensors, stats, scaling, include_conv, short_matrices):
    """TSV-Merge (Gargiulo et al., 2025, "Task Singular Vectors", arXiv 2412.00081): per weight matrix keep each
    task's top min(out, in) / T singular triplets, concatenate them, orthogonalise the left and right singular
    vectors (polar factor, removing inter-task interference) and recombine; other tensors averaged; times
    `scaling` (alpha, reference 1). `include_conv` as for wudi.

    short_matrices: a matrix with fewer singular directions than tasks (min(out, in) < T, so each task's share
    min(out, in) // T is 0). "average": averaged like a non-matrix tensor, so it still moves. "zero": as the
    reference code (compute_and_sum_svd_mem_reduction in AntoAndGar/task_singular_vectors
    src/utils/TSVM_utils.py and FusionBench's method/task_singular_vector/utils/TSVM_utils.py), whose
    concatenation of zero triplets per task recombines to 0: the matrix keeps w0, dropping every task's
    update there, which the paper does not ask for; averaging keeps it, as for other tensors. The original
    code also averages every tensor whose name holds "text_projection" (CLIP's text projection), which we do
    not single out; with include_conv=False and short_matrices="zero" we match FusionBench's TSVM without
    exclude_keys (up to rounding: we compute in float32 where it keeps float64 inputs in float64)."""
    matrices = [matrix_view(t, include_conv) for t in tensors]
    if matrices[0] is None or len(tensors) == 1:  # one task keeps all its triplets: tau itself, without rounding
        return scaling * mean_of(tensors)
    count = len(tensors)
    rank = min(matrices[0].shape) // count
    if rank == 0:  # fewer singular directions than tasks: no task gets one
        if short_matrices == "zero":  # what the reference's empty concatenation recombines to
            return torch.zeros_like(tensors[0])
        return scaling * mean_of(tensors)
    out_dim, in_dim = matrices[0].shape
    # Only count * rank directions are kept; the reference's zero columns up to min(out, in) carry a zero
    # singular value, so its result is the same without them (and the Gram of the kept ones is invertible).
    kept = count * rank
    u_all = torch.zeros(out_dim, kept)
    s_all = torch.zeros(kept)
    vh_all = torch.zeros(kept, in_dim)
    for i, matrix in enumerate(matrices):
        u, s, vh = top_singular(matrix.float(), rank)
        u_all[:, i * rank:(i + 1) * rank] = u
        s_all[i * rank:(i + 1) * rank] = s
        vh_all[i * rank:(i + 1) * rank] = vh
    merged = (polar(u_all) * s_all) @ polar(vh_all)
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


def _iso_c_tensor(key, tensors, stats, scaling, include_conv):
    """Iso-C (Marczak et al., 2025, "No Task Left Behind", arXiv 2502.04959): per weight matrix, the SVD of
    sum_t tau_t with every singular value replaced by their mean (an isotropic spectrum); other tensors
    averaged; times `scaling` (alpha; FusionBench default 1, the paper tunes it on validation data).
    `include_conv` as for wudi."""
    summed = matrix_view(sum_of(tensors), include_conv)
    if summed is None:
        return scaling * mean_of(tensors)
    orthogonal, s = polar_and_spectrum(summed.float())
    merged = s.mean() * orthogonal  # the spectrum flattened to its mean: every direction equally scaled
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


def _iso_cts_tensor(key, tensors, stats, scaling, common_space_fraction, include_conv):
    """Iso-CTS (Marczak et al., 2025, arXiv 2502.04959): like Iso-C, but only `common_space_fraction` of the
    directions come from the sum's top singular vectors; the rest are split equally between tasks, each filled
    with that task's top directions outside the common subspace; then orthogonalised and given an isotropic
    spectrum. `scaling` and `include_conv` as for iso_c."""
    matrices = [matrix_view(t, include_conv) for t in tensors]
    if matrices[0] is None:
        return scaling * mean_of(tensors)
    matrices = [m.float() for m in matrices]
    count = len(matrices)
    width = min(matrices[0].shape)
    # Common subspace from the sum's top directions; the rest split equally between tasks (reference sizing).
    common = int(width * common_space_fraction)
    common = width - round((width - common) / count) * count
    per_task = (width - common) // count
    out_dim, in_dim = matrices[0].shape
    u_common, s_common, vh_common = top_singular(sum_of(matrices), common)
    u_all, s_all, vh_all = torch.zeros(out_dim, width), torch.zeros(width), torch.zeros(width, in_dim)
    for i, matrix in enumerate(matrices):
        specific = matrix - u_common @ (u_common.T @ matrix)  # task's part outside the common subspace
        u_t, s_t, vh_t = top_singular(specific, per_task)
        u_all[:, i * per_task:(i + 1) * per_task] = u_t
        s_all[i * per_task:(i + 1) * per_task] = s_t
        vh_all[i * per_task:(i + 1) * per_task] = vh_t
    start = count * per_task
    u_all[:, start:start + common] = u_common
    s_all[start:start + common] = s_common
    vh_all[start:start + common] = vh_common
    merged = s_all.mean() * (polar(u_all) @ polar(vh_all))
    return scaling * merged.reshape(tensors[0].shape).to(tensors[0].dtype)


# What merge.registry pairs with each name's OperatorSpec.
IMPLEMENTATIONS = {
    "wudi": {"per_tensor": _wudi_tensor},
    "tsv_m": {"per_tensor": _tsvm_tensor},
    "iso_c": {"per_tensor": _iso_c_tensor},
    "iso_cts": {"per_tensor": _iso_cts_tensor},
}
