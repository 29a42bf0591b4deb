"""A/B timing ratios a reader can judge: the median of per-round ratios with a distribution-free 95 % interval.

A ratio of two medians taken over the same rounds hides how much it moves: on a noisy 2-core machine the same
procedure gave medians 8 % apart between runs. Each round of a benchmark times A and B back to back, so
A_r / B_r shares whatever slowed the machine during round r; the median of those paired ratios, with the
order-statistic interval for a median (exact binomial coverage, no assumption on the timing distribution, which
is skewed), says both the ratio and whether a target such as 1.25 is met or only touched.
"""

from __future__ import annotations

import math
import statistics


def median_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high): [low, high] = [x_(k), x_(n+1-k)] of the sorted values, with k the largest rank such
    that P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2, so it covers the population median with probability at
    least `confidence`. NaN bounds when n is too small for any such k (fewer than 6 values at 95 %)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2
    below, rank = 0.0, 0  # below = P(Binomial(n, 1/2) < rank + 1)
    while rank < n // 2:
        below += math.comb(n, rank) / 2**n
        if below > tail:
            break
        rank += 1
    median = statistics.median(ordered)
    if rank == 0:
        return median, math.nan, math.nan
    return median, ordered[rank - 1], ordered[n - rank]


def paired_ratios(numerators, denominators) -> list[float]:
    """A_r / B_r for each round r (the two lists in round order, equally long)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired ratios need as many rounds of each: {len(numerators)} against {len(denominators)}")
    return [a / b for a, b in zip(numerators, denominators)]


def describe(numerators, denominators) -> str:
    """'1.22 [1.18, 1.27]': the median paired ratio and its 95 % interval."""
    median, low, high = median_interval(paired_ratios(numerators, denominators))
    if math.isnan(low):
        return f"{median:5.2f} [interval needs >= 6 rounds]"
    return f"{median:5.2f} [{low:.2f}, {high:.2f}]"
