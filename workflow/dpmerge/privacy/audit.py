"""One-run privacy auditing: a lower bound on the epsilon a training run can satisfy, from its canaries.

Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023, arXiv 2305.08846): m
canaries, each in the training set independently with probability 1/2 (a secret coin per canary), one training
run, and a score per canary from what the run released (higher: more likely included). The auditor guesses
"in" for the k+ highest scores and "out" for the k- lowest, abstains on the rest, and counts its correct guesses.
An (epsilon, delta)-DP run makes v or more correct out of r guesses with probability at most
`one_run_p_value(m, r, v, epsilon, delta)` (their Theorem 3.1 with the delta term of their Proposition 5.7 and
Algorithm 2), so every epsilon whose p-value falls below the significance level is refuted: the largest one is
the audit's lower bound epsilon_lb.

What a lower bound means: the run is *not* (epsilon, delta)-DP for any epsilon below epsilon_lb, at the stated
confidence over the coins and the run's randomness. It is never a guarantee: an audit with little power (few
canaries, weak scores) gives epsilon_lb near 0 whatever the truth. A private run whose epsilon_lb exceeds the
epsilon its record claims has refuted its own record.

The guess counts are fixed before any score is seen (`guess_counts`), and the bound is taken over all of them
with a Bonferroni correction (significance / their number), so choosing the best of them does not inflate it.

Pooling (`audit_scores` on the canaries of several runs together): Steinke et al.'s theorem needs the mechanism
to be (epsilon, delta)-DP in each canary's coin, nothing more. Independent runs (other tasks, other seeds), each
(epsilon, delta)-DP in its own canaries, form one such mechanism: a canary's coin changes its own run only. So
the canaries of a release group's runs make one audit of m = their sum, with the power of the larger m and one
bound in place of a maximum over runs (the maximum of several 95 % bounds is not a 95 % bound).

Exposure (`membership_auc`): how well the scores separate included from excluded canaries, as the area under
the ROC curve with DeLong's variance. It compares groups of canaries (is one class more exposed than another?)
with an interval, where a lower bound on epsilon only says what was refuted.
"""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[v or more correct guesses out of r] for an (epsilon, delta)-DP run, m = `canaries` each included with
    probability 1/2 (Steinke et al.'s Algorithm 2: beta + alpha * 2 m delta)."""
    from scipy.stats import binom

    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {canaries}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # the accuracy of epsilon-DP randomized response
    beta = float(binom.sf(correct - 1, guesses, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or correct == 0:
        return min(beta, 1.0)
    shortfall = np.arange(1, correct + 1)
    # P[v - i <= Binomial(r, q) < v] / i, its largest value over i
    alpha = float(np.max((binom.sf(correct - shortfall - 1, guesses, q) - beta) / shortfall))
    return min(beta + alpha * 2 * canaries * delta, 1.0)


def epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float,
                        significance: float = 1 - CONFIDENCE) -> float:
    """The largest epsilon that v correct out of r guesses refute at `significance` (0 when none is refuted)."""
    from scipy.optimize import brentq

    if not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance}")

    def refuted(epsilon: float) -> float:  # > 0 while epsilon is refuted
        return significance - one_run_p_value(canaries, guesses, correct, epsilon, delta)

    if guesses == 0 or refuted(0.0) <= 0:
        return 0.0
    high = 1.0
    while refuted(high) > 0:
        if high > 1e3:  # every epsilon refuted: only a run with no noise at all looks like this
            return math.inf
        high *= 2
    return float(brentq(refuted, high / 2 if high > 1 else 0.0, high, xtol=1e-6))


def guess_counts(canaries: int) -> list[tuple[int, int]]:
    """The (k+, k-) pairs an audit of m canaries tries, fixed before any score is read: guesses on 1/8, 1/4
    and 1/2 of the canaries, split evenly between "in" and "out", and the same numbers of "in" guesses alone."""
    pairs = []
    for fraction in (8, 4, 2):
        total = max(2, canaries // fraction)
        pairs += [(total // 2, total - total // 2), (total, 0)]
    return sorted(set(p for p in pairs if sum(p) <= canaries))


def audit_scores(scores, included, delta: float, confidence: float = CONFIDENCE,
                 counts: list[tuple[int, int]] | None = None) -> dict:
    """epsilon_lb from canary `scores` and their secret inclusion coins `included`: the best over the guess
    counts (`guess_counts(m)` unless given), each judged at significance (1 - confidence) / their number."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"one score per canary: {scores.shape} scores, {included.shape} coins")
    if not np.all(np.isfinite(scores)):
        raise ValueError("canary scores must be finite")
    m = int(scores.size)
    counts = guess_counts(m) if counts is None else counts
    significance = (1 - confidence) / len(counts)
    # ties broken by canary index, never by the coins: a guess must not see them
    order = np.lexsort((np.arange(m), -scores))
    best = {"epsilon_lb": 0.0, "guesses": 0, "correct": 0, "guessed_in": 0, "guessed_out": 0}
    for k_in, k_out in counts:
        correct = int(included[order[:k_in]].sum()) + int((~included[order[m - k_out:]]).sum() if k_out else 0)
        bound = epsilon_lower_bound(m, k_in + k_out, correct, delta, significance)
        if bound > best["epsilon_lb"] or best["guesses"] == 0:
            best = {"epsilon_lb": bound, "guesses": k_in + k_out, "correct": correct, "guessed_in": k_in,
                    "guessed_out": k_out}
    auc, variance = membership_auc(scores, included)
    se = math.sqrt(variance)
    half_width = _normal_quantile(confidence) * se
    return {**best, "canaries": m, "included": int(included.sum()), "delta": delta, "confidence": confidence,
            "guess_settings": len(counts), "auc": auc, "auc_se": se, "auc_low": auc - half_width,
            "auc_high": auc + half_width}


def _normal_quantile(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def membership_auc(scores, included) -> tuple[float, float]:
    """P[an included canary outscores an excluded one] (ties count 1/2) and its DeLong variance (DeLong, DeLong &
    Clarke-Pearson 1988, by midranks). 0.5: the scores tell nothing; NaN without canaries on both sides."""
    from scipy.stats import rankdata

    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    inside, outside = scores[included], scores[~included]
    n_in, n_out = inside.size, outside.size
    if not n_in or not n_out:
        return math.nan, math.nan
    overall = rankdata(scores)
    # each included canary's share of excluded ones it beats, and each excluded one's share of included it beats
    beats = (overall[included] - rankdata(inside)) / n_out
    beaten = 1 - (overall[~included] - rankdata(outside)) / n_in
    auc = float(beats.mean())
    if n_in < 2 or n_out < 2:
        return auc, math.nan
    return auc, float(beats.var(ddof=1) / n_in + beaten.var(ddof=1) / n_out)


def exposure_difference(first: dict, second: dict, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """AUC of `first` minus AUC of `second` (two `audit_scores` results on disjoint canaries, whose coins are
    independent) with its normal interval."""
    difference = first["auc"] - second["auc"]
    spread = _normal_quantile(confidence) * math.hypot(first["auc_se"], second["auc_se"])
    return difference, difference - spread, difference + spread
