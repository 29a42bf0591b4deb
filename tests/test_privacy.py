"""Noise calibration and accounting: epsilon <= target, DP-SAM as the paired mechanism, independent check."""

import math

import pytest

from dpmerge.privacy import calibrate_noise_multiplier, effective_noise_multiplier, spent_epsilon


@pytest.mark.parametrize("target", [1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("queries", [1, 2])
def test_calibrated_sigma_meets_target_and_is_tight(target, queries):
    q, steps, delta = 16 / 1200, 113, 1 / 1200
    sigma = calibrate_noise_multiplier(target, delta, q, steps, queries_per_step=queries)
    spent = spent_epsilon(sigma, q, steps, delta, queries_per_step=queries)
    assert spent <= target
    assert spent > 0.9 * target  # not wastefully noisy
    # a little less noise would overspend
    assert spent_epsilon(0.95 * sigma, q, steps, delta, queries_per_step=queries) > spent


def test_dp_sam_noise_is_sqrt2_times_dp_sgd_noise():
    q, steps, delta = 0.01, 300, 1e-4
    sgd = calibrate_noise_multiplier(4.0, delta, q, steps, queries_per_step=1)
    sam = calibrate_noise_multiplier(4.0, delta, q, steps, queries_per_step=2)
    assert sam == pytest.approx(math.sqrt(2) * sgd, rel=1e-9)


def test_two_queries_at_sigma_cost_one_query_at_sigma_over_sqrt2():
    q, steps, delta, sigma = 0.02, 200, 1e-5, 1.3
    paired = spent_epsilon(sigma, q, steps, delta, queries_per_step=2)
    single = spent_epsilon(sigma / math.sqrt(2), q, steps, delta, queries_per_step=1)
    assert paired == pytest.approx(single, rel=1e-12)
    # and strictly more than pretending one query was made
    assert paired > spent_epsilon(sigma, q, steps, delta, queries_per_step=1)
    assert effective_noise_multiplier(sigma, 2) == pytest.approx(sigma / math.sqrt(2))


@pytest.mark.parametrize(
    "sigma,q,steps,delta,queries",
    [
        (1.0, 0.01, 100, 1e-5, 1),
        (1.6, 0.05, 500, 1e-4, 2),
        (2.0, 0.001, 5000, 1e-6, 1),
        (1.5, 0.02, 50, 1e-3, 2),
        (0.9, 16 / 1200, 113, 1 / 1200, 2),  # near the embedded default at epsilon = 4
    ],
)
def test_rdp_epsilon_agrees_with_dp_accounting(sigma, q, steps, delta, queries):
    """Independent implementation: Google's dp-accounting RDP accountant, same orders as Opacus."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant
    from dpmerge.privacy import RDP_ORDERS

    ours = spent_epsilon(sigma, q, steps, delta, queries_per_step=queries, accountant="rdp")
    accountant = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma / math.sqrt(queries)))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    theirs = accountant.get_epsilon(delta)
    assert ours == pytest.approx(theirs, rel=0.01)


def test_prv_accountant_is_available_and_close_to_rdp():
    q, steps, delta, sigma = 0.01, 200, 1e-5, 1.0
    prv = spent_epsilon(sigma, q, steps, delta, accountant="prv")
    rdp = spent_epsilon(sigma, q, steps, delta, accountant="rdp")
    assert 0 < prv <= rdp * 1.01  # PRV is the tighter accountant


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="unknown accountant 'gdp'"):
        spent_epsilon(1.0, 0.1, 10, 1e-5, accountant="gdp")
    with pytest.raises(ValueError, match="delta"):
        calibrate_noise_multiplier(4.0, 0.0, 0.1, 10)


def ledger_row(task, rho=0.05, epsilon="4.0", **overrides):
    row = {"path": f"{task}-{rho}-{epsilon}.safetensors", "task": task, "backbone": "b", "method": "dp_merging",
           "rho": rho, "anchor_lambda": 0.05, "target_epsilon": epsilon, "spent_epsilon": "3.9", "seed": 0,
           "delta": 1e-3, "record_complete": True}
    row.update(overrides)
    return row


def test_ledger_groups_sensitivity_runs_apart_and_flags_a_task_released_twice_in_one_group():
    import pandas as pd

    from dpmerge.privacy_ledger import check_ledger, ledger_report

    # the default run and a rho-sweep run on the same tasks: two alternative experiments, each in budget
    sweep = pd.DataFrame([ledger_row("a"), ledger_row("b"), ledger_row("a", rho=0.2), ledger_row("b", rho=0.2)])
    assert check_ledger(sweep) == []
    report = ledger_report(sweep, [])
    assert "| b | dp_merging | 0.2 | 0.05 | 4.0 | 0 | 2 |" in report and "composes their budgets" in report
    twice = pd.DataFrame([ledger_row("a"), ledger_row("a", path="again.safetensors")])
    assert "task(s) ['a'] released twice" in check_ledger(twice)[0]
    over = pd.DataFrame([ledger_row("a", spent_epsilon="4.2")])
    assert "spent epsilon 4.2 exceeds target 4.0" in check_ledger(over)[0]
