"""A release at any target epsilon from releases at several budgets (privacy/mixing.py): the selection's delta and
epsilon against closed forms and an independent dp_accounting PLD computation, the linear programme against brute
force, and the combination's composition."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from dpmerge.privacy.accounting import calibrate_noise_multiplier, composed_epsilon, record_mechanisms
from dpmerge.privacy.mixing import (
    DeltaCurve,
    check_components,
    combination_epsilon,
    mixture_delta,
    mixture_epsilon,
    plan_selection,
    selection_probabilities,
)

DELTA = 1e-5


def record(sigma, rate=0.05, steps=60, target=4.0, queries=1, **changes):
    return {"noise_multiplier": sigma, "sample_rate": rate, "steps_by_queries": {str(queries): steps},
            "neighbouring": "add_remove", "delta": DELTA, "target_epsilon": target, "accountant": "rdp",
            "num_train_examples": 1000, "pretrained_sha256": "w0", **changes}


def calibrated(target, rate=0.05, steps=60):
    return record(calibrate_noise_multiplier(target, DELTA, rate, steps, 1, "rdp", "add_remove"), rate, steps, target)


def gaussian_delta(epsilon, mu):
    """delta(eps) of the Gaussian mechanism with mu = sensitivity / sigma (Balle & Wang 2018), exact."""
    return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


def smallest_epsilon(delta_of, delta):
    """A grid search, coarse then fine (delta(eps) is non-increasing): the first grid point within delta."""
    coarse = np.arange(0.0, 40.0, 0.1)
    first = float(coarse[np.argmax([delta_of(e) <= delta for e in coarse])])
    fine = np.arange(max(first - 0.1, 0.0), first + 1e-3, 1e-3)
    return float(fine[np.argmax([delta_of(e) <= delta for e in fine])])


def test_delta_curve_is_an_upper_bound_on_the_exact_gaussian_and_close_to_it():
    # no subsampling: T Gaussian steps at sigma compose exactly to one Gaussian with mu = sqrt(T) / sigma
    sigma, steps = 3.0, 4
    curve = DeltaCurve(record(sigma, rate=1.0, steps=steps))
    mu = math.sqrt(steps) / sigma
    for epsilon in (0.5, 1.0, 2.0, 3.0):
        exact = gaussian_delta(epsilon, mu)
        assert exact <= curve(epsilon) <= exact * 1.02 + 1e-12


def test_a_two_model_selection_matches_the_exact_gaussian_mixture():
    """Two unsubsampled Gaussian releases mixed 30/70: the mixture's epsilon at delta against the closed form."""
    components = [record(2.0, rate=1.0, steps=1, target=1.9), record(0.8, rate=1.0, steps=1, target=5.6)]
    p = [0.3, 0.7]
    ours = mixture_epsilon([DeltaCurve(r) for r in components], p, DELTA)
    exact = smallest_epsilon(lambda e: 0.3 * gaussian_delta(e, 1 / 2.0) + 0.7 * gaussian_delta(e, 1 / 0.8), DELTA)
    assert ours == pytest.approx(exact, abs=0.02)
    # and it lies between the components' own epsilons (the mixture is no worse than its worst component)
    alone = [mixture_epsilon([DeltaCurve(r)], [1.0], DELTA) for r in components]
    assert alone[0] < ours < alone[1]


@pytest.mark.slow
def test_a_subsampled_two_model_selection_matches_dp_accountings_pld_computed_independently():
    from dp_accounting.pld import privacy_loss_distribution

    components = [calibrated(1.0), calibrated(8.0)]
    p = [0.6, 0.4]
    ours = mixture_epsilon([DeltaCurve(r) for r in components], p, DELTA)
    plds = [privacy_loss_distribution.from_gaussian_mechanism(
        r["noise_multiplier"], sampling_prob=r["sample_rate"], value_discretization_interval=1e-4
    ).self_compose(60) for r in components]
    independent = smallest_epsilon(lambda e: sum(w * pld.get_delta_for_epsilon(e) for w, pld in zip(p, plds)), DELTA)
    assert ours == pytest.approx(independent, rel=0.01, abs=0.005)


def test_the_linear_programme_finds_the_brute_force_optimum_and_meets_delta():
    deltas, utilities, budget = np.array([1e-7, 4e-6, 3e-5]), np.array([40.0, 55.0, 70.0]), 1e-5
    p = selection_probabilities(deltas, utilities, budget)
    assert p.sum() == pytest.approx(1.0) and (p >= 0).all() and p @ deltas <= budget * (1 + 1e-12)
    best = max(
        (a * utilities[0] + b * utilities[1] + (1 - a - b) * utilities[2])
        for a in np.linspace(0, 1, 401) for b in np.linspace(0, 1 - a, max(2, int(round((1 - a) * 400)) + 1))
        if a * deltas[0] + b * deltas[1] + (1 - a - b) * deltas[2] <= budget
    )
    assert p @ utilities == pytest.approx(best, abs=0.1)
    # a component already within budget with the best utility is taken alone
    assert selection_probabilities([1e-7, 1e-6], [30.0, 60.0], 1e-5).tolist() == pytest.approx([0.0, 1.0])


def test_no_selection_below_the_cheapest_component_and_bad_utilities_are_refused():
    with pytest.raises(ValueError, match="no selection reaches the target.*cheapest component has delta"):
        selection_probabilities([1e-3, 1e-2], [1.0, 2.0], 1e-5)
    with pytest.raises(ValueError, match="one delta and one utility per component"):
        selection_probabilities([1e-7, 1e-6], [1.0], 1e-5)
    with pytest.raises(ValueError, match="utilities must be finite"):
        selection_probabilities([1e-7, 1e-6], [1.0, float("nan")], 1e-5)


@pytest.mark.slow
def test_a_target_between_two_budgets_mixes_both_and_its_recomputed_epsilon_meets_the_target():
    components = [calibrated(1.0), calibrated(8.0)]
    selection = plan_selection(components, target_epsilon=4.0, delta=DELTA)
    assert all(0 < p < 1 for p in selection.probabilities)
    assert selection.epsilon <= 4.0 + 1e-3
    curves = [DeltaCurve(r) for r in components]
    assert mixture_delta(curves, selection.probabilities, 4.0) <= DELTA * (1 + 1e-9)
    # more weight on the larger budget would break the target: the programme used the budget up
    heavier = [selection.probabilities[0] - 0.05, selection.probabilities[1] + 0.05]
    assert mixture_delta(curves, heavier, 4.0) > DELTA


def test_a_combination_costs_the_composition_of_every_component():
    components = [calibrated(1.0), calibrated(1.0), calibrated(4.0)]
    combined = combination_epsilon(components, DELTA)
    assert combined == pytest.approx(composed_epsilon([m for r in components for m in record_mechanisms(r)], DELTA,
                                                      "rdp", "add_remove"))
    assert combined > 4.0  # never below its most expensive component
    two_at_one = combination_epsilon(components[:2], DELTA)
    assert 1.0 < two_at_one < 2.0  # two runs at 1 compose sublinearly, as RDP does


def test_components_must_be_private_releases_of_one_task():
    with pytest.raises(ValueError, match="non-private release"):
        check_components([record(1.0), record(0.0, target=float("inf"))])
    with pytest.raises(ValueError, match="disagree on num_train_examples"):
        check_components([record(1.0), record(1.0, num_train_examples=999)])
    with pytest.raises(ValueError, match="lacks noise_multiplier"):
        check_components([{"target_epsilon": 1.0}])
