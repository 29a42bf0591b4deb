"""dpmerge's array RDP analysis against Opacus's own, which it replaces for speed only."""

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as opacus_rdp
from opacus.accountants.utils import get_noise_multiplier

from dpmerge.privacy import accounting, rdp

ORDERS = accounting.RDP_ORDERS


@pytest.mark.parametrize("q", [1e-3, 0.01, 64 / 1200, 0.2, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("sigma", [0.3, 0.5, 0.68, 1.0, 2.0, 5.0, 20.0, 80.0])
def test_rdp_matches_opacus_at_every_order(q, sigma):
    expected = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=ORDERS)
    got = rdp.compute_rdp(q, sigma, 7, ORDERS)
    # Both sum the same series in floating point; where A_alpha is within 1e-6 of 1 the log cancels, so the
    # comparison is absolute there (1e-11 in RDP is 1e-11 in epsilon)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
@pytest.mark.parametrize("target, delta, q, steps", [
    (4.0, 1 / 1200, 64 / 1200, 19),   # the embedded default's budget
    (8.0, 1 / 1200, 64 / 1200, 19),
    (1.0, 1e-5, 0.01, 1000),
    (2.0, 1e-3, 0.3, 3),
    (0.5, 1e-5, 16 / 50_000, 31_250),  # the paper's CLIP setting: 10 epochs at B = 16
])
def test_calibration_equals_opacus_search(target, delta, q, steps):
    expected = get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q, steps=steps,
                                    alphas=ORDERS)
    assert rdp.noise_multiplier_for(target, delta, q, steps, ORDERS) == expected


@pytest.mark.slow
def test_composed_epsilon_equals_opacus_accountant():
    mechanisms = [(0.68, 64 / 1200, 19), (0.51 / 2**0.5, 64 / 1200, 4), (3.0, 256 / 1200, 1)]
    accountant = RDPAccountant()
    accountant.history = list(mechanisms)
    expected = accountant.get_epsilon(delta=1 / 1200, alphas=ORDERS)
    assert accounting.composed_epsilon(mechanisms, 1 / 1200, "rdp", "add_remove") == pytest.approx(expected, rel=1e-10)
    assert accounting.composed_epsilon(mechanisms, 1 / 1200, "prv", "add_remove") > 0  # PRV still through Opacus


def test_no_noise_spends_everything_and_no_sampling_nothing():
    assert np.isinf(rdp.compute_rdp(0.1, 0.0, 1, ORDERS)).all()
    assert (rdp.compute_rdp(0.0, 1.0, 1, ORDERS) == 0).all()
