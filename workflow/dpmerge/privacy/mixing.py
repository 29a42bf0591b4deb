"""A release at any target epsilon from models of one task trained at several budgets, without training again
("Differentially Private Model Merging", arXiv 2604.20985): random selection and linear combination, each
accounted from its components' privacy records.

Random selection. Models w_1..w_k of one task are trained at several budgets, each from its own keyed randomness
(so independently given the data), and kept private; one is released, w_I with I ~ p drawn from a secret stream
that is independent of the data. The released distribution is then the mixture sum_i p_i P_i(D), and the
hockey-stick divergence H_{e^eps}(P || Q) = delta(eps) is jointly convex, so for every eps

    delta_mix(eps) <= sum_i p_i delta_i(eps),

each delta_i(eps) from its record's privacy loss distribution (dp_accounting's PLD accountant, whose default
pessimistic discretisation gives an upper bound). Publishing I as well costs nothing more: I has the same law
under both neighbouring datasets, so the pair's divergence is exactly that sum. `selection_probabilities` picks
p for a target (eps, delta) by a linear programme: the largest expected utility sum_i p_i u_i subject to
sum_i p_i delta_i(eps) <= delta.

Linear combination sum_i a_i w_i. It is post-processing of the joint release (w_1, ..., w_k) of independent runs
on the same data, so it costs their composition: never less than its most expensive component, which is why
selection, not combination, reaches targets between the components' budgets. Combination is the right tool
only where its components are cheap and averaging their independent noise helps (several models at a small
epsilon, e.g. two runs at epsilon 1 composed to about 1.4, with the noise of each averaged down); stages/mix.py
`combine` releases the average of independent repetitions at one budget, and the mixing table scores it beside
selection and training at the same target.

Neither helps where the components are also released (as the epsilon sweep's are, for Table 4): an adversary
who sees every component has the components' composition, whatever is mixed from them. The ledger composes what
was released; the mixture's own epsilon is the guarantee of a deployment that releases only the mixture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmerge.privacy import pld
from dpmerge.privacy.accounting import ACCOUNTANTS, composed_epsilon, record_mechanisms


def _check_component(record: dict, where: str) -> None:
    missing = [f for f in ("noise_multiplier", "sample_rate", "steps_by_queries", "neighbouring", "delta",
                           "target_epsilon") if f not in record]
    if missing:
        raise ValueError(f"{where}: the privacy record lacks {', '.join(missing)}; not a task vector's record")
    if not math.isfinite(float(record["target_epsilon"])) or float(record["noise_multiplier"]) <= 0:
        raise ValueError(f"{where}: a non-private release (epsilon = inf) cannot be a component of a private "
                         f"mixture")


def check_components(records: list[dict], names: list[str] | None = None) -> None:
    """Components must be private releases of the same task's data under one neighbouring relation."""
    names = names or [f"component {i}" for i in range(len(records))]
    if len(records) < 1:
        raise ValueError("a mixture needs at least one component")
    for record, name in zip(records, names):
        _check_component(record, name)
    for field in ("neighbouring", "num_train_examples", "public_n", "pretrained_sha256"):
        values = {str(r.get(field)) for r in records}
        if len(values) > 1:
            raise ValueError(f"components disagree on {field} ({', '.join(sorted(values))}): a mixture is of "
                             f"models of one task's data from one w0")


class DeltaCurve:
    """delta(eps) of one release, from its record: dp_accounting's PLD of the Poisson-subsampled Gaussian steps
    that ran (its `steps_by_queries`, each k-query step at sigma/sqrt(k)), an upper bound at every eps."""

    def __init__(self, record: dict):
        # the accountant releases are calibrated and checked with, on its grid (privacy/pld.py)
        self._accountant = pld.accountant(record_mechanisms(record), record["neighbouring"])

    def __call__(self, epsilon: float) -> float:
        return float(self._accountant.get_delta(float(epsilon)))


def mixture_delta(curves: list[DeltaCurve], probabilities, epsilon: float) -> float:
    """sum_i p_i delta_i(eps): the selection's delta at eps (joint convexity of the hockey-stick divergence)."""
    return float(sum(p * curve(epsilon) for p, curve in zip(probabilities, curves) if p > 0))


def mixture_epsilon(curves: list[DeltaCurve], probabilities, delta: float, tolerance: float = 1e-4,
                    target: float | None = None) -> float:
    """The smallest eps (to `tolerance`, rounded up) at which the selection's delta is <= `delta`: delta(eps) is
    non-increasing in eps, so bisection finds it. A `target` that itself meets `delta` caps the answer (the
    rounding up must not take a mixture built to meet its target above it)."""
    if target is not None and mixture_delta(curves, probabilities, target) <= delta:
        return min(mixture_epsilon(curves, probabilities, delta, tolerance), float(target))
    low, high = 0.0, 1.0
    while mixture_delta(curves, probabilities, high) > delta:
        low, high = high, 2.0 * high
        if high > 1e4:
            raise ValueError(f"no epsilon below 1e4 reaches delta = {delta:g} for this mixture")
    if mixture_delta(curves, probabilities, 0.0) <= delta:
        return 0.0
    while high - low > tolerance:
        middle = 0.5 * (low + high)
        if mixture_delta(curves, probabilities, middle) > delta:
            low = middle
        else:
            high = middle
    return high


def selection_probabilities(deltas_at_target, utilities, delta: float) -> np.ndarray:
    """p maximising sum_i p_i u_i subject to sum_i p_i delta_i <= delta, sum_i p_i = 1, p >= 0 (a linear
    programme; its optimum mixes at most two components). `deltas_at_target`: each component's delta at the
    target eps. Refused when even the cheapest component is above `delta`: no selection reaches the target."""
    from scipy.optimize import linprog

    d = np.asarray(deltas_at_target, dtype=float)
    u = np.asarray(utilities, dtype=float)
    if d.shape != u.shape or d.ndim != 1 or not len(d):
        raise ValueError(f"one delta and one utility per component, got {d.shape} and {u.shape}")
    if not np.all(np.isfinite(u)):
        raise ValueError(f"utilities must be finite numbers, got {u.tolist()}")
    # a hair inside the budget: the mixture's delta is recomputed by summing in another order
    budget = delta * (1.0 - 1e-9)
    if d.min() > budget:
        raise ValueError(f"no selection reaches the target: the cheapest component has delta {d.min():.3g} > "
                         f"{delta:g} at the target epsilon; add a component trained at a smaller budget")
    result = linprog(-u, A_ub=d[None, :], b_ub=[budget], A_eq=np.ones((1, len(d))), b_eq=[1.0],
                     bounds=[(0.0, 1.0)] * len(d), method="highs")
    if not result.success:
        raise RuntimeError(f"the selection's linear programme failed: {result.message}")
    p = np.clip(result.x, 0.0, 1.0)
    p /= p.sum()
    # the solver's tolerance may leave the constraint a hair above delta: move that much mass to the cheapest
    spent, cheapest = float(p @ d), int(np.argmin(d))
    if spent > budget:
        share = (spent - budget) / (spent - d[cheapest])
        p = (1.0 - share) * p
        p[cheapest] += share
    return p


@dataclass(frozen=True)
class Selection:
    probabilities: list[float]
    epsilon: float  # the mixture's epsilon at `delta`, recomputed from p (<= the target)
    delta: float
    target_epsilon: float
    component_deltas: list[float]  # each component's delta at the target epsilon


def plan_selection(records: list[dict], target_epsilon: float, delta: float, utilities=None) -> Selection:
    """The selection for a target (eps, delta): p by `selection_probabilities` (utilities default to the
    components' own target epsilons: a data-free proxy, more budget more utility; public-data scores may be
    given instead, never scores on a private split), then the mixture's epsilon recomputed from that p."""
    check_components(records)
    curves = [DeltaCurve(r) for r in records]
    deltas = [curve(target_epsilon) for curve in curves]
    if utilities is None:
        utilities = [float(r["target_epsilon"]) for r in records]
    p = selection_probabilities(deltas, utilities, delta)
    epsilon = mixture_epsilon(curves, p, delta, target=target_epsilon)
    return Selection([float(x) for x in p], float(epsilon), float(delta), float(target_epsilon),
                     [float(x) for x in deltas])


def combination_epsilon(records: list[dict], delta: float, accountant: str | None = None) -> float:
    """epsilon of any linear combination sum_i a_i w_i of the components: the composition of every component's
    steps (independent runs on the same data), by the accountant (default: the one the components were calibrated
    with, the PLD where they differ)."""
    check_components(records)
    if accountant is None:
        used = {str(r.get("accountant", "rdp")) for r in records}
        accountant = used.pop() if len(used) == 1 and used <= set(ACCOUNTANTS) else "pld"
    return composed_epsilon([m for r in records for m in record_mechanisms(r)], delta, accountant,
                            records[0]["neighbouring"])


def mixture_record_epsilon(record: dict) -> float:
    """A released mixture's epsilon at its delta, recomputed from what its record carries (stages/mix.py writes
    it), never from the epsilon it claims: a selection's from its components and probabilities, a combination's
    from the composition of its components."""
    mixture = record["mixture"]
    if mixture.get("mode") == "combination":
        return combination_epsilon(mixture["components"], float(record["delta"]))
    check_components(mixture["components"])
    return mixture_epsilon([DeltaCurve(c) for c in mixture["components"]], mixture["probabilities"],
                           float(record["delta"]), target=float(record["target_epsilon"]))


def mixture_mechanisms(record: dict) -> list[tuple[float, float, int]]:
    """What a mixture costs when composed with its task's other mechanisms, as mechanisms an accountant composes:
    every component's steps. Exact for a combination; conservative for a selection (selecting one is
    post-processing of releasing all), whose own privacy curve is not a composition of Gaussian steps."""
    return [m for c in record["mixture"]["components"] for m in record_mechanisms(c)]
