"""bench/paired_ratio.py: the interval printed beside every paired timing ratio must have the coverage it claims."""

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

from paired_ratio import describe, median_interval, paired_ratios  # noqa: E402


@pytest.mark.parametrize("n,low_rank", [(6, 1), (10, 2), (20, 6), (30, 10), (100, 40)])
def test_the_interval_is_the_order_statistics_of_the_binomial_tables(n, low_rank):
    # Ranks from the standard sign-test table for a 95 % interval for a median (e.g. Conover, Table A3)
    values = [float(v) for v in random.Random(n).sample(range(1000), n)]
    median, low, high = median_interval(values)
    ordered = sorted(values)
    assert (low, high) == (ordered[low_rank - 1], ordered[n - low_rank])
    assert low <= median <= high


def test_too_few_rounds_give_no_interval_rather_than_a_narrow_one():
    median, low, high = median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert median == 3.0 and math.isnan(low) and math.isnan(high)
    assert "needs >= 6 rounds" in describe([1.0] * 5, [1.0] * 5)


def test_coverage_is_at_least_the_confidence_on_skewed_timings():
    # Step times are right-skewed (a stall only ever adds time); the population median of this lognormal is 1.2
    rng = random.Random(0)
    trials, covered = 2000, 0
    for _ in range(trials):
        ratios = [1.2 * math.exp(rng.gauss(0, 0.1)) * (1.5 if rng.random() < 0.1 else 1.0) ** rng.choice((1, -1))
                  for _ in range(20)]
        _, low, high = median_interval(ratios)
        covered += low <= 1.2 <= high
    # exact coverage at n = 20 is 95.86 %; 2000 trials put the estimate within about 1 point of it
    assert covered / trials >= 0.94


def test_ratios_are_paired_by_round():
    assert paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="as many rounds"):
        paired_ratios([1.0], [1.0, 2.0])
    assert describe([1.1, 1.2, 1.3, 1.2, 1.25, 1.15], [1.0] * 6) == " 1.20 [1.10, 1.30]"
