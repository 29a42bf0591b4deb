"""Exact accounting of Poisson-subsampled Gaussian steps by privacy loss distributions (Google's dp_accounting).

dp_accounting's PLD accountant accounts the subsampled Gaussian under both relations from the mechanism's exact
dominating pair, in units of the clipping norm C (`privacy_loss_mechanism.AdditiveNoisePrivacyLoss`):

- add/remove: (1 - q) N(0, s^2) + q N(1, s^2) against N(0, s^2), both directions;
- replace-one: (1 - q) N(0, s^2) + q N(-1, s^2) against (1 - q) N(0, s^2) + q N(1, s^2): the example in the
  batch contributes a clipped gradient of norm <= C, its replacement another, up to 2C apart; at q = 1 this is
  the Gaussian at sensitivity 2C, below it strictly less than doubling the noise would charge.

Its estimates are pessimistic (every rounding of the loss is upward), so the epsilon it returns is an upper bound
at any discretisation. At `DISCRETISATION` the embedded budgets (up to ~40 steps) agree with a ten times finer grid
to five digits; a paper-scale run (3,125 steps) comes out 0.3 % (replace-one) to 0.7 % (add/remove) above it, so
its calibrated sigma is a little larger than needed, never smaller. Calibration searches sigma on the same
function the record is later checked with, so the claim and the ledger's recomputation are one computation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

DISCRETISATION = 1e-3
RELATIONS = ("replace_one", "add_remove")


@contextmanager
def _quiet():
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # dp_accounting logs every low-probability tail it truncates
    try:
        yield
    finally:
        logging.getLogger().setLevel(level)


def accountant(mechanisms: list[tuple[float, float, int]], neighbouring: str,
               discretisation: float = DISCRETISATION):
    """dp_accounting's PLD accountant with every (noise multiplier, sample rate, steps) composed, under the
    relation; noise multipliers are per query at sensitivity C (k queries on one batch: sigma / sqrt(k))."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if neighbouring not in RELATIONS:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}; known: {', '.join(RELATIONS)}")
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if neighbouring == "replace_one"
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    ledger = pld_privacy_accountant.PLDAccountant(relation, value_discretization_interval=discretisation)
    with _quiet():
        for sigma, rate, steps in mechanisms:
            if int(steps) > 0 and float(rate) > 0:
                ledger.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
                    float(rate), dp_accounting.GaussianDpEvent(float(sigma))), int(steps)))
    return ledger


def epsilon(mechanisms: list[tuple[float, float, int]], delta: float, neighbouring: str,
            discretisation: float = DISCRETISATION) -> float:
    if not any(int(steps) > 0 for _, _, steps in mechanisms):
        return 0.0
    ledger = accountant(mechanisms, neighbouring, discretisation)
    with _quiet():
        return float(ledger.get_epsilon(float(delta)))


# The search's first pass: ten times coarser, so about ten times cheaper, and still an upper bound (pessimistic
# rounding), so the sigma it finds is already valid, only possibly a little larger than needed.
SEARCH_DISCRETISATION = 1e-2


def _root(excess, start: float) -> float:
    """log sigma where `excess` (decreasing in log sigma) crosses 0: bracketed by steps of log 2 from `start`,
    then Brent's method."""
    from scipy import optimize

    step = math.log(2.0)
    low = high = start
    value = excess(start)
    if value > 0:
        while value > 0:
            low, high = high, high + step
            if high > math.log(1e6):
                raise ValueError("the privacy budget is too low: it needs a noise multiplier above 1e6")
            value = excess(high)
    else:
        while value <= 0:
            high, low = low, low - step
            if low < math.log(1e-4):  # any noise is enough: the mechanism barely touches the data
                return high
            value = excess(low)
    return optimize.brentq(excess, low, high, xtol=1e-4, rtol=1e-6)


def noise_multiplier_for(target_epsilon: float, delta: float, sample_rate: float, steps: int, neighbouring: str,
                         epsilon_tolerance: float = 0.01) -> float:
    """The noise multiplier of one query per step whose epsilon is <= target and within `epsilon_tolerance` of
    it (Opacus's tolerance): epsilon falls with sigma; the root is found on the coarse grid first, then on the
    grid the claim is checked with, starting there."""
    aim = target_epsilon - epsilon_tolerance / 2

    def excess_on(discretisation):
        return lambda log_sigma: epsilon([(math.exp(log_sigma), sample_rate, steps)], delta, neighbouring,
                                         discretisation) - aim

    coarse = _root(excess_on(SEARCH_DISCRETISATION), 0.0)
    spent = epsilon([(math.exp(coarse), sample_rate, steps)], delta, neighbouring)
    if target_epsilon - epsilon_tolerance <= spent <= target_epsilon:  # already met on the final grid
        return math.exp(coarse)
    sigma = math.exp(_root(excess_on(DISCRETISATION), coarse))
    # The discretised loss is a step function of sigma: move up until the claim is met on the final grid.
    while epsilon([(sigma, sample_rate, steps)], delta, neighbouring) > target_epsilon:
        sigma *= 1.001
    return sigma


# Where calibrations are kept between processes: the pipeline sets it to a folder of its results. A calibration
# is a function of public numbers only (epsilon, delta, q, steps, relation), so the folder holds nothing private;
# a study calibrates a handful of distinct settings for hundreds of fine-tunes, each search ~0.5 s.
CACHE_VARIABLE = "DPMERGE_CALIBRATION_CACHE"


def cached_noise_multiplier_for(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                                neighbouring: str) -> float:
    """`noise_multiplier_for`, remembered in $DPMERGE_CALIBRATION_CACHE when set. A remembered sigma is used only
    if it still meets the target within the tolerance on today's accountant (one evaluation), so a stale or edited
    entry is recomputed, never trusted."""
    folder = os.environ.get(CACHE_VARIABLE)
    arguments = {"target_epsilon": float(target_epsilon), "delta": float(delta), "sample_rate": float(sample_rate),
                 "steps": int(steps), "neighbouring": neighbouring, "discretisation": DISCRETISATION,
                 "dp_accounting": version("dp_accounting")}
    if not folder:
        return noise_multiplier_for(target_epsilon, delta, sample_rate, steps, neighbouring)
    path = Path(folder) / (hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:32] + ".json")
    try:
        sigma = float(json.loads(path.read_text())["sigma"])
        spent = epsilon([(sigma, sample_rate, steps)], delta, neighbouring)
        if target_epsilon - 0.01 <= spent <= target_epsilon:
            return sigma
    except (OSError, ValueError, KeyError, TypeError):
        pass
    sigma = noise_multiplier_for(target_epsilon, delta, sample_rate, steps, neighbouring)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump({**arguments, "sigma": sigma}, handle)
    os.replace(handle.name, path)
    return sigma
