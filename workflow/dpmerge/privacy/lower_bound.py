"""A lower bound on a release's epsilon that shares no code with any accountant: the exact privacy of one test.

An adversary who sees the T noisy steps of a release can always add them up (post-processing), so whatever
(epsilon, delta) the release claims must hold for that sum too. Along the direction the one differing example
pushes (the dominating pair of the Poisson-subsampled Gaussian, in units of the clipping norm C), the sum of T
steps at noise multiplier s is a Gaussian mixture over how many batches held the example, K ~ Binomial(T, q):

- replace-one: N(-K, T s^2) against N(+K, T s^2) (the example's clipped gradient, or its replacement's, opposite);
- add/remove: N(K, T s^2) against N(0, T s^2), in both directions.

delta_sum(eps) = integral of (p - e^eps q)_+ is computed here by quadrature, exactly up to the grid, and is <= the
release's true delta(eps). So a claim (eps, delta) with delta_sum(eps) > delta is false, whatever an accountant
says. The sum is not the optimal test (the PLD accounts the likelihood ratio of every step), so the bound is below
the true epsilon: for a paper-like run (N 5000, B 16, 10 epochs) calibrated for add/remove at epsilon 1 it finds
1.16 under replace-one, enough to expose the claim of 1.0 (dp_accounting's PLD: 1.30). Steps that made k queries
on one batch are the same mechanism at s = sigma/sqrt(k); records mixing several k are bounded by each group of
steps alone (ignoring the others is post-processing too) and the largest bound is kept.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

GRID = 20001
TAIL_STANDARD_DEVIATIONS = 12.0
NEGLIGIBLE_LOG_WEIGHT = -70.0  # binomial counts with probability below e^-70 cannot move delta at 1e-30


def _log_densities(sigma: float, rate: float, steps: int, neighbouring: str):
    """x grid and log densities of the sum under the two neighbours (the one with the example first)."""
    counts = np.arange(steps + 1, dtype=np.float64)
    log_weights = stats.binom.logpmf(counts, steps, rate)
    kept = log_weights > NEGLIGIBLE_LOG_WEIGHT
    counts, log_weights = counts[kept], log_weights[kept]
    spread = math.sqrt(steps) * sigma
    reach = counts.max() + TAIL_STANDARD_DEVIATIONS * spread
    x = np.linspace(-reach, reach, GRID)

    def mixture(sign: float) -> np.ndarray:
        return special.logsumexp(log_weights[:, None]
                                 + stats.norm.logpdf(x[None, :], sign * counts[:, None], spread), axis=0)

    if neighbouring == "replace_one":
        return x, mixture(-1.0), mixture(1.0)
    return x, mixture(1.0), stats.norm.logpdf(x, 0.0, spread)


def sum_test(sigma: float, rate: float, steps: int, neighbouring: str):
    """delta(epsilon) of the sum of `steps` steps, a lower bound on the mechanism's delta(epsilon), as a function
    of epsilon: the two densities are computed once, each epsilon costs one pass over the grid."""
    x, log_p, log_q = _log_densities(sigma, rate, steps, neighbouring)

    def delta(epsilon: float) -> float:
        def hockey_stick(first, second):
            return float(np.trapezoid(np.maximum(np.exp(first) - np.exp(epsilon + second), 0.0), x))

        found = hockey_stick(log_p, log_q)
        if neighbouring == "add_remove":  # not symmetric: the removal direction too
            found = max(found, hockey_stick(log_q, log_p))
        return found

    return delta


def lower_bound_epsilon(mechanisms: list[tuple[float, float, int]], delta: float, neighbouring: str) -> float:
    """The largest epsilon at which the sum test of some group of steps still exceeds `delta`: the release's
    epsilon at `delta` is at least this (0 when no group's test reaches delta at epsilon 0)."""
    best = 0.0
    for sigma, rate, steps in mechanisms:
        if int(steps) <= 0 or float(rate) <= 0 or float(sigma) <= 0:
            continue
        test = sum_test(float(sigma), float(rate), int(steps), neighbouring)

        def excess(eps, test=test):
            return test(eps) - delta

        if excess(best) <= 0:
            continue
        high = max(1.0, 2 * best)
        while excess(high) > 0:
            high *= 2
        best = optimize.brentq(excess, best, high, xtol=1e-4)
    return best
