"""The noise floor of a matrix: what white noise of unknown level does to its singular values, and how to keep
only what stands above it. Gavish and Donoho's results for a low-rank signal X in white noise, Y = X + sigma Z
with Z an m x n matrix of i.i.d. standard normals (m <= n, beta = m / n):

- the noise's singular values fill a Marchenko-Pastur bulk whose upper edge is sigma sqrt(n) (1 + sqrt(beta));
- sigma is estimated from the matrix itself as median(s) / sqrt(n mu_beta), mu_beta the median of the
  Marchenko-Pastur law of ratio beta ("The Optimal Hard Threshold for Singular Values is 4/sqrt(3)", IEEE Trans.
  Inf. Theory 60(8), 2014, arXiv 1305.5870, Section III.E): robust while the signal's rank is small against m;
- the optimal hard threshold for a known sigma is lambda*(beta) sqrt(n) sigma (ibid., Eq. 11);
- the optimal shrinker of each singular value for Frobenius loss is, in units of sigma sqrt(n),
  eta(y) = sqrt((y^2 - beta - 1)^2 - 4 beta) / y above the bulk edge 1 + sqrt(beta), zero below ("Optimal
  Shrinkage of Singular Values", IEEE Trans. Inf. Theory 63(4), 2017, arXiv 1405.7511, Eq. 7).

Everything is computed in float64; the orientation of a matrix does not matter (the singular values of Y and
Y^T are the same).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from scipy import integrate, optimize


@lru_cache(maxsize=256)
def marchenko_pastur_median(beta: float) -> float:
    """The median of the Marchenko-Pastur law of ratio beta in (0, 1] (the eigenvalues of Z Z^T / n), by
    quadrature of its density and root finding on the CDF."""
    if not 0 < beta <= 1:
        raise ValueError(f"beta must be in (0, 1], got {beta}")
    low, high = (1 - math.sqrt(beta)) ** 2, (1 + math.sqrt(beta)) ** 2

    def density(x):
        return math.sqrt(max((high - x) * (x - low), 0.0)) / (2 * math.pi * beta * x)

    def cdf_minus_half(x):
        return integrate.quad(density, low, x, limit=200)[0] - 0.5

    return float(optimize.brentq(cdf_minus_half, low, high, xtol=1e-12))


def optimal_hard_threshold(beta: float) -> float:
    """lambda*(beta): the optimal hard threshold in units of sigma sqrt(n) (4 / sqrt(3) for a square matrix)."""
    return math.sqrt(2 * (beta + 1) + 8 * beta / (beta + 1 + math.sqrt(beta**2 + 14 * beta + 1)))


def aspect(shape) -> tuple[float, int]:
    """(beta = min / max, n = max) of a matrix shape."""
    m, n = sorted(shape)
    return m / n, n


def noise_level(singular: torch.Tensor, shape) -> float:
    """sigma estimated from a matrix's singular values: median(s) / sqrt(n mu_beta)."""
    beta, n = aspect(shape)
    return float(singular.double().median()) / math.sqrt(n * marchenko_pastur_median(beta))


def shrunk_singular_values(singular: torch.Tensor, shape, sigma: float, rule: str) -> torch.Tensor:
    """The singular values kept: `hard`, those above lambda*(beta) sqrt(n) sigma, unchanged; `shrink`, each
    replaced by the Frobenius-optimal eta(y) (zero at or below the bulk edge)."""
    beta, n = aspect(shape)
    scale = sigma * math.sqrt(n)
    if scale == 0:
        return singular.clone()
    if rule == "hard":
        return torch.where(singular > optimal_hard_threshold(beta) * scale, singular, torch.zeros_like(singular))
    if rule == "shrink":
        y = singular.double() / scale
        above = y > 1 + math.sqrt(beta)
        inside = ((y**2 - beta - 1) ** 2 - 4 * beta).clamp_min(0)
        eta = torch.where(above, inside.sqrt() / y.clamp_min(1e-300), torch.zeros_like(y))
        return (eta * scale).to(singular.dtype)
    raise ValueError(f"rule must be 'hard' or 'shrink', got {rule!r}")


def hard_threshold_share(update: torch.Tensor) -> float:
    """The share of sum_i s_i^2 held by singular values above the optimal hard threshold for an unknown noise
    level, lambda*(beta) sqrt(n) sigma-hat; NaN for a zero matrix."""
    update = update.double()
    singular = torch.linalg.svdvals(update)
    energy = float(singular.pow(2).sum())
    if energy == 0:
        return math.nan
    kept = shrunk_singular_values(singular, update.shape, noise_level(singular, update.shape), "hard")
    return float(kept.pow(2).sum()) / energy
