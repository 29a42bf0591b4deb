"""Data-free covariance merging: ACE-Merging (Xu et al., "ACE-Merging: Data-Free Model Merging with Adaptive
Covariance Estimation", arXiv 2603.02945, CVPR 2026), as its official code computes it: unravel-xu/ACE-Merging,
src/merge/strategy.py, `MergeStrategy.ace_merging` (the same at commits 22d9dfe and d267001). RegMean's closed
form W = (sum_t W_t S_t)(sum_t S_t)^-1 with every task's input covariance S_t estimated from its own update
instead of from data, so it reads no statistic and, on private releases, spends no privacy.

Orientation. A weight matrix is read as stored, rows as samples: the covariance W~^T W~ is over its columns. For a
torch Linear (out, in) that is the layer's input, as the paper intends; for a convolution (out, in, kh, kw), seen
as (out, in*kh*kw) with include_conv, the unfolded input patch. A matrix stored as (in, out), applied as x @ W
(Hugging Face GPT-2's Conv1D, open_clip's `proj` and `text_projection`), and an embedding table (vocabulary,
width) get a covariance over their output axis instead, exactly as the official code does (it never transposes).
Tensors that are not matrices are averaged, as there; the official code also averages any tensor whose name
holds "text_projection", which we do not single out (as for the other matrix-shaped rules). ``scaling``
multiplies the whole merged vector (the official lambda, applied to the model).

Departures, each numerical only: everything is computed in float64 and A is solved for, not inverted (the
official code inverts A in float32 and falls back to the pseudo-inverse silently; ours warns if it must); a
refinement with k = 0 directions (min(out, in) < 1 / k_fraction) adds nothing, where the official mean over no
singular values is NaN and makes the whole matrix NaN.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from dpmerge.merge.matrices import matrix_view, mean_of
from dpmerge.merge.noise_floor import hard_threshold_share
from dpmerge.merge.sources import consume

# Guards of the official code: added to traces before a log or a division
TINY = 1e-12
# A task's squared norm at most this share of the largest one's counts as a zero update (see ace_layer's warning)
ZERO_UPDATE = 1e-12


@dataclass(frozen=True)
class AceLayer:
    """One matrix's merge and what decided it: gamma (NaN for one task) and whether it passed the gate."""

    merged: torch.Tensor
    gamma: float
    heterogeneous: bool


def heterogeneity(squared_norms: list[float]) -> float:
    """gamma = Var(l) / (mean(l)^2 + 1e-12), l_t = log(||dW_t||_F^2 + 1e-12), Var with Bessel's correction (the
    official torch.var); NaN for one task, whose gate stays shut. Not scale invariant: scaling every update by c
    shifts each l_t by 2 log c, so the clipping norm, the noise and the learning rate move gamma."""
    if len(squared_norms) < 2:
        return math.nan
    logs = [math.log(value + TINY) for value in squared_norms]
    mean = sum(logs) / len(logs)
    variance = sum((value - mean) ** 2 for value in logs) / (len(logs) - 1)
    return variance / (mean**2 + TINY)


def squared_norms(matrices: list[torch.Tensor]) -> list[float]:
    """||dW_t||_F^2 of each (uncentred) update, in float64: the traces gamma is computed from."""
    return [float(m.double().pow(2).sum()) for m in matrices]


def ace_layer(matrices: list[torch.Tensor], *, eps: float, gamma_threshold: float, k_fraction: float, stage: int,
              prior: str, key: str = "", free_inputs: bool = False) -> AceLayer:
    """ACE on one weight matrix (T updates dW_t of shape m x n), stages cumulative:

    E1  dW~_t = dW_t - 1 mu_t^T (rows centred), S_t = dW~_t^T dW~_t (no 1/m), R_t = S_t + eps I;
        W0 = (sum_t dW~_t R_t) A^-1 with A = sum_t R_t. With equal R_t this is the mean of the centred updates.
    E2  if the layer is heterogeneous (gamma > gamma_threshold, `heterogeneity` of the uncentred traces):
        S_t /= tr(S_t) and eps_t = eps / tr(S_t), i.e. RegMean with task weights 1 / ||dW~_t||_F^2.
    E3  A += C. prior "official": C = 1 c^T, c the column means of sum_t S_t (rank one, not symmetric, added to
        every row of A), divided by the mean raw trace mean_t ||dW_t||_F^2 where heterogeneous: the code's
        torch.mean(sum(Sigmas), dim=0, keepdim=True). "mean_cov": C = mean_t S_t, a ridge toward w0 (the reading
        of its intent that minimises a quadratic objective; not what produced the paper's numbers).
    E4  where heterogeneous: D = W0 + sum_t dW_t (S_t - S_bar), S_bar = mean_t R_t (uncentred dW_t, S_t without
        eps); D = U S V^T; k = floor(k_fraction min(m, n)); W = W0 + mean(S_1..S_k) U_k V_k^T.

    Memory: the inputs are read twice (traces, then one pass; with `free_inputs` each slot of `matrices` is
    emptied once used), and besides them at most two n x n and three m x n float64 matrices, plus the solver's
    copy of A: no list of T covariances, and the official prior from a running sum of column sums.
    """
    count = len(matrices)
    rows, width = matrices[0].shape
    norms = squared_norms(matrices)
    gamma = heterogeneity(norms)
    heterogeneous = bool(gamma > gamma_threshold)  # NaN (one task) compares False: the gate stays shut
    normalise = stage >= 2 and heterogeneous
    refine = stage >= 4 and heterogeneous
    if normalise and min(norms) <= ZERO_UPDATE * max(norms):
        # eps_t = eps / (tr(S_t) + 1e-12) reaches 1e10 for a zero update: A, and with the refinement the merge,
        # blow up (a task vector of norm 0.06 merged to 6.5e7 in the denoising study), as in the official code
        warnings.warn(f"ace: a task's update of {key or 'a weight matrix'} is (near) zero while the gate is open; "
                      "the adaptive normalisation divides eps by its trace and the merge is not to be trusted "
                      "(the official code does the same)", RuntimeWarning, stacklevel=3)
    sums = _covariance_sums(matrices, eps=eps, normalise=normalise, full_prior=stage >= 3 and prior == "mean_cov",
                            refine=refine, free_inputs=free_inputs)
    if refine:  # sum_t dW_t (S_t - S_bar), formed while sum_t R_t is still unchanged by the prior
        residual = sums.update_covariance.sub_((sums.update @ sums.ridged).div_(count))
        sums.update = sums.update_covariance = None
    system = sums.ridged  # from here on, A itself: the prior goes in in place
    if stage >= 3:
        if prior == "official":
            structural = sums.columns / width  # torch.mean(sum_t S_t, dim=0): the mean of each column
            if heterogeneous:
                structural /= sum(norms) / count + TINY
            system += structural  # broadcast: the same row added to every row of A
        else:
            system += sums.covariance.div_(count)
            sums.covariance = None
    merged = _solve_right(sums.weighted, system, key)
    del system
    sums.ridged = sums.weighted = None
    if refine:
        u, s, vh = torch.linalg.svd(residual.add_(merged), full_matrices=False)
        del residual
        k = int(min(rows, width) * k_fraction)
        if k > 0:
            merged += s[:k].mean() * (u[:, :k] @ vh[:k])
    return AceLayer(merged, gamma, heterogeneous)


@dataclass
class _CovarianceSums:
    """What one pass over a layer's T updates accumulates (float64), each slot emptied once it is used up."""

    ridged: torch.Tensor  # sum_t (S_t + eps_t I), n x n
    columns: torch.Tensor  # column sums of sum_t S_t (the official prior), 1 x n
    covariance: torch.Tensor | None  # sum_t S_t (the mean_cov prior only), n x n
    weighted: torch.Tensor  # sum_t dW~_t (S_t + eps_t I), m x n
    update: torch.Tensor | None  # sum_t dW_t (the refinement only), m x n
    update_covariance: torch.Tensor | None  # sum_t dW_t S_t (the refinement only), m x n


def _covariance_sums(matrices: list[torch.Tensor], *, eps: float, normalise: bool, full_prior: bool, refine: bool,
                     free_inputs: bool) -> _CovarianceSums:
    """ace_layer's one pass over the updates (stages E1-E2, and what E3 and E4 need), holding one update's
    covariance at a time."""
    rows, width = matrices[0].shape

    def zeros(height: int) -> torch.Tensor:
        return torch.zeros(height, width, dtype=torch.float64)

    sums = _CovarianceSums(zeros(width), zeros(1), zeros(width) if full_prior else None, zeros(rows),
                           zeros(rows) if refine else None, zeros(rows) if refine else None)
    for index in range(len(matrices)):
        update = matrices[index].double()
        if free_inputs:
            matrices[index] = None
        centred = update - update.mean(dim=0, keepdim=True)
        covariance = centred.T @ centred
        eps_t, trace = eps, 1.0
        if normalise:
            trace = float(torch.trace(covariance)) + TINY
            covariance /= trace
            eps_t = eps / trace
        sums.columns += covariance.sum(dim=0, keepdim=True)
        if sums.covariance is not None:
            sums.covariance += covariance
        if refine:
            sums.update += update
        if rows < width:
            # X S_t = (X dW~^T) dW~ / tr through the m x m Gram: 2 m^2 n flops instead of m n^2 (half, for a
            # ViT's fc2 or patch embedding: m = 768, n = 3072)
            sums.weighted.addmm_(centred @ centred.T, centred, alpha=1 / trace).add_(centred, alpha=eps_t)
            if refine:
                sums.update_covariance.addmm_(update @ centred.T, centred, alpha=1 / trace)
        else:
            if refine:
                sums.update_covariance.addmm_(update, covariance)
            sums.weighted.addmm_(centred, covariance).add_(centred, alpha=eps_t)
        covariance.diagonal().add_(eps_t)
        sums.ridged += covariance
        del update, centred, covariance
    return sums


def _solve_right(b: torch.Tensor, a: torch.Tensor, key: str) -> torch.Tensor:
    """X with X A = B: solved (better conditioned than forming A^-1), or by the pseudo-inverse with a warning
    where A is exactly singular (only possible with the official prior, which is not positive definite)."""
    try:
        return torch.linalg.solve(a, b, left=False)
    except RuntimeError:
        warnings.warn(f"ace: the system matrix of {key or 'a weight matrix'} is singular; merged by its "
                      "pseudo-inverse (least-squares solution)", RuntimeWarning, stacklevel=3)
        return b @ torch.linalg.pinv(a)


def noise_floor_share(update: torch.Tensor) -> float:
    """The share of the estimated covariance's trace, tr(dW~^T dW~) = sum_i s_i^2 over the singular values of
    the row-centred update, held by singular values above the noise floor: Gavish and Donoho's optimal hard
    threshold for a low-rank signal in white noise of unknown level (merge/noise_floor.py). DP's noise adds a
    roughly isotropic floor to every S_t; this says how much of S_t stands above it (1: all signal, 0: all
    floor). NaN for a zero update."""
    update = update.double()
    return hard_threshold_share(update - update.mean(dim=0, keepdim=True))


def gate_readings(key: str, tensors: list[torch.Tensor], gamma_threshold: float, include_conv: bool) -> list[dict]:
    """What ACE sees in one tensor of T task vectors, one row per task: gamma and whether the gate opens (the
    same for every task), each task's squared norm and its covariance's share above the noise floor. No row for
    a tensor ACE averages (not a matrix)."""
    matrices = [matrix_view(t, include_conv) for t in tensors]
    if matrices[0] is None:
        return []
    norms = squared_norms(matrices)
    gamma = heterogeneity(norms)
    rows, cols = matrices[0].shape
    return [{"tensor": key, "task_index": index, "rows": rows, "cols": cols, "gamma": gamma,
             "gate_open": bool(gamma > gamma_threshold), "squared_norm": norm,
             "share_above_noise_floor": noise_floor_share(matrix)}
            for index, (matrix, norm) in enumerate(zip(matrices, norms))]


def _ace_tensor(key, tensors, stats, eps, gamma_threshold, k_fraction, scaling, stage, prior, include_conv):
    """ACE-Merging (Xu et al., 2026, "ACE-Merging", arXiv 2603.02945) per weight matrix (`ace_layer` states the
    mathematics; `stage` 1-4 stops after E1..E4 of the paper's Table 4), other tensors averaged, times
    `scaling`. `include_conv` as for wudi."""
    if matrix_view(tensors[0], include_conv) is None:
        return scaling * mean_of(tensors)
    shape, dtype = tensors[0].shape, tensors[0].dtype
    matrices = [matrix_view(t, include_conv) for t in consume(tensors)]  # the list holds each task until used
    layer = ace_layer(matrices, eps=eps, gamma_threshold=gamma_threshold, k_fraction=k_fraction, stage=stage,
                      prior=prior, key=key, free_inputs=True)
    return (scaling * layer.merged).reshape(shape).to(dtype)


# What merge.registry pairs with each name's OperatorSpec.
IMPLEMENTATIONS = {"ace": {"per_tensor": _ace_tensor}}
