"""Denoising a released task vector from the vector alone: no data, no record, so under DP a post-processing of
the release that costs no budget.

DP's noise in a task vector is, to first order, isotropic: the sum of the steps' Gaussian noise, scaled by the
learning rate and, under AdamW, by a preconditioner the noise itself dominates, so its level is estimated from the
vector rather than computed from the record. Per tensor:

- a weight matrix (a Linear's (out, in), a convolution's (out, in*kh*kw), an embedding table) of at least
  `MIN_SPECTRUM` rows and columns: its singular values against the Marchenko-Pastur noise floor of the level
  estimated from its own spectrum (merge/noise_floor.py). `svd_hard` keeps those above Gavish and Donoho's
  optimal hard threshold; `svd_shrink` shrinks each by their Frobenius-optimal shrinker (zero inside the bulk);
- any other tensor (biases, norms' scales, a class token, thin matrices), and every tensor under `james_stein`:
  positive-part James-Stein shrinkage towards zero, x (1 - (d - 2) sigma^2 / |x|^2)_+, with sigma the release's
  pooled noise level: the median of its matrices' estimates, or, for a vector with no matrix to estimate from,
  the median absolute deviation of all its entries / 0.6745 (right while the signal is sparse).

What each tensor was given (estimated noise level, kept rank, share of its squared norm kept) is returned with
the denoised vector, for the output's metadata.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from dpmerge.merge.matrices import matrix_view
from dpmerge.merge.noise_floor import noise_level, shrunk_singular_values
from dpmerge.merge.specs import DENOISERS

# Fewer singular values than this give no usable median for the noise level: such a matrix is shrunk as a vector.
MIN_SPECTRUM = 8
# The median absolute deviation of a standard normal: MAD / 0.6745 estimates sigma.
MAD_TO_SIGMA = 0.6744897501960817


@dataclass(frozen=True)
class TensorReading:
    """What denoising did to one tensor: how (`spectral` or `james_stein`), the noise level it used (estimated
    from the tensor for a spectral one, pooled otherwise), its rank before and after (NaN for a vector), and the
    share of its squared norm kept."""

    how: str
    noise_level: float
    rank: float
    kept_rank: float
    kept_energy: float


def check_denoiser(method: str) -> None:
    if method not in DENOISERS:
        raise ValueError(f"denoise method must be one of {', '.join(DENOISERS)}, got {method!r}")


def spectral_matrix(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor as a matrix whose spectrum can be read against the noise floor, or None."""
    matrix = matrix_view(tensor, include_conv=True)
    if matrix is None or min(matrix.shape) < MIN_SPECTRUM:
        return None
    return matrix


def denoise_matrix(matrix: torch.Tensor, rule: str) -> tuple[torch.Tensor, TensorReading]:
    """One matrix through its SVD in float64, `rule` 'hard' or 'shrink' (merge/noise_floor.py)."""
    work = matrix.double()
    u, singular, vh = torch.linalg.svd(work, full_matrices=False)
    sigma = noise_level(singular, work.shape)
    kept = shrunk_singular_values(singular, work.shape, sigma, rule)
    energy = float(singular.pow(2).sum())
    reading = TensorReading("spectral", sigma, float((singular > 0).sum()), float((kept > 0).sum()),
                            float(kept.pow(2).sum()) / energy if energy else math.nan)
    return ((u * kept) @ vh).to(matrix.dtype), reading


def james_stein(tensor: torch.Tensor, sigma: float) -> tuple[torch.Tensor, TensorReading]:
    """Positive-part James-Stein towards zero at noise level sigma; a tensor of fewer than 3 entries, where it
    does not dominate the identity, is kept as it is."""
    squared = float(tensor.double().pow(2).sum())
    size = tensor.numel()
    factor = 1.0 if size < 3 or squared == 0 else max(0.0, 1.0 - (size - 2) * sigma**2 / squared)
    reading = TensorReading("james_stein", sigma, math.nan, math.nan, factor**2 if squared else math.nan)
    return tensor * factor, reading


def pooled_noise_level(estimates: list[float], tensors: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The release's noise level for tensors without a spectrum of their own: the median of its matrices'
    estimates, or the MAD of every entry where it has no such matrix. Returns (sigma, how it was had)."""
    if estimates:
        return float(torch.tensor(estimates, dtype=torch.float64).median()), "median of the matrices' estimates"
    entries = torch.cat([t.detach().double().flatten() for t in tensors.values()])
    if not len(entries):
        return 0.0, "no entries"
    return float((entries - entries.median()).abs().median()) / MAD_TO_SIGMA, "median absolute deviation"


def denoise_vector(tensors: dict[str, torch.Tensor], method: str,
                   on_tensor: Callable[[int, int], None] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(the denoised tensors, a summary for metadata: method, pooled noise level and its source, and one
    TensorReading per tensor as a dict). Matrices first, so that the pooled level is known for the rest.
    `on_tensor(done, total)` is called after each tensor (a long job's progress line)."""
    check_denoiser(method)
    total = len(tensors)
    tick = on_tensor or (lambda done, total: None)
    out: dict[str, torch.Tensor] = {}
    readings: dict[str, dict] = {}
    estimates: list[float] = []
    if method != "james_stein":
        rule = "shrink" if method == "svd_shrink" else "hard"
        for key, tensor in tensors.items():
            matrix = spectral_matrix(tensor)
            if matrix is None:
                continue
            denoised, reading = denoise_matrix(matrix, rule)
            out[key] = denoised.reshape(tensor.shape)
            readings[key] = asdict(reading)
            if reading.noise_level > 0:  # a zero matrix (a layer this task left frozen) says nothing of the noise
                estimates.append(reading.noise_level)
            tick(len(out), total)
    if method == "james_stein":
        estimates = [level for level in (noise_level(torch.linalg.svdvals(m.double()), m.shape) for m in
                                         (spectral_matrix(t) for t in tensors.values()) if m is not None)
                     if level > 0]
    sigma, source = pooled_noise_level(estimates, tensors)
    for key, tensor in tensors.items():
        if key not in out:
            out[key], reading = james_stein(tensor, sigma)
            readings[key] = asdict(reading)
            tick(len(out), total)
    ordered = {key: out[key] for key in tensors}
    return ordered, {"method": method, "pooled_noise_level": sigma, "pooled_from": source,
                     "tensors": {key: _json_safe(readings[key]) for key in tensors}}


def _json_safe(reading: dict) -> dict:
    """NaN (a vector's rank, a zero tensor's energy) as None: metadata is JSON, which has no NaN."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in reading.items()}
