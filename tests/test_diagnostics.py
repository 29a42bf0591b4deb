"""Curvature diagnostics on quadratic losses, where sharpness, lambda_max, the merge-gap bound and the
joint-task linearity gap are known in closed form."""


import pytest
import torch

from conftest import flat, unflat
from dpmerge.diagnostics.common import task_loss
from dpmerge.diagnostics.curvature import hessian_max_eigenvalue, merge_gap_bound, sharpness_proxy
from dpmerge.diagnostics.linearity import joint_task_linearity
from dpmerge.models.evaluation import evaluate_head


def quadratic(eigenvalues, seed=0, centre_seed=1):
    """L(w) = 1/2 (w - c)^T A (w - c) + 0.3 with A = Q diag(eigenvalues) Q^T."""
    q, _ = torch.linalg.qr(torch.randn(7, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    hessian = q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T
    centre = torch.randn(7, generator=torch.Generator().manual_seed(centre_seed), dtype=torch.float64)

    def loss(params):
        offset = flat(params) - centre
        return 0.5 * offset @ hessian @ offset + 0.3

    return loss, hessian, centre, q


EIGENVALUES = [5.0, 2.0, 1.0, 0.5, 0.25, 0.1, 0.0]


def test_hessian_max_eigenvalue_is_exact_on_a_quadratic():
    loss, _, _, _ = quadratic(EIGENVALUES)
    params = unflat(torch.randn(7, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    assert hessian_max_eigenvalue(loss, params, iterations=500, tolerance=1e-12) == pytest.approx(5.0, rel=1e-6)


def test_hessian_max_eigenvalue_at_a_saddle_is_the_top_one_not_the_largest_in_magnitude():
    loss, _, _, _ = quadratic([1.5, 0.2, -0.1, -0.3, -0.5, -2.0, -6.0])
    params = unflat(torch.zeros(7, dtype=torch.float64))
    assert hessian_max_eigenvalue(loss, params, iterations=2000, tolerance=1e-14) == pytest.approx(1.5, rel=1e-5)


def test_sharpness_proxy_is_the_closed_form_ascent_step():
    loss, hessian, centre, _ = quadratic(EIGENVALUES)
    w = torch.randn(7, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    gradient = hessian @ (w - centre)
    unit = gradient / gradient.norm()
    for rho in (0.01, 0.5):
        expected = rho * float(unit @ gradient) + 0.5 * rho**2 * float(unit @ hessian @ unit)
        assert sharpness_proxy(loss, unflat(w), rho) == pytest.approx(expected, rel=1e-9)
    assert sharpness_proxy(loss, unflat(centre), 0.5) == 0.0  # stationary: no ascent direction
    with pytest.raises(ValueError, match="rho must be > 0"):
        sharpness_proxy(loss, unflat(w), 0.0)


def test_sharper_quadratic_has_larger_sharpness():
    flat_loss, _, centre, _ = quadratic([0.5] * 7)
    sharp_loss, _, _, _ = quadratic([5.0] * 7)
    w = unflat(centre + 0.1)
    assert sharpness_proxy(sharp_loss, w, 0.1) > sharpness_proxy(flat_loss, w, 0.1)


def test_merge_gap_bound_holds_and_is_tight_along_the_top_eigenvector_from_the_minimum():
    loss, _, centre, q = quadratic(EIGENVALUES)
    top = q[:, 0]
    result = merge_gap_bound(loss, unflat(centre), unflat(centre + 0.7 * top), iterations=500, tolerance=1e-12)
    assert result["gradient_norm"] == pytest.approx(0.0, abs=1e-9)
    assert result["displacement"] == pytest.approx(0.7)
    assert result["merge_gap"] == pytest.approx(0.5 * 5.0 * 0.49, rel=1e-9)
    assert result["bound"] == pytest.approx(result["merge_gap"], rel=1e-5)
    for seed in range(5):  # elsewhere the bound is a bound
        generator = torch.Generator().manual_seed(10 + seed)
        w_t = torch.randn(7, generator=generator, dtype=torch.float64)
        w_merge = w_t + torch.randn(7, generator=generator, dtype=torch.float64)
        result = merge_gap_bound(loss, unflat(w_t), unflat(w_merge), iterations=500, tolerance=1e-12)
        assert result["merge_gap"] <= result["bound"] + 1e-9
        assert result["beta"] == pytest.approx(5.0, rel=1e-5)


def test_identical_models_have_no_gap_and_linear_joint_loss():
    loss, _, _, _ = quadratic(EIGENVALUES)
    w = unflat(torch.randn(7, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    result = merge_gap_bound(loss, w, w)
    assert result["merge_gap"] == 0.0 and result["bound"] == 0.0
    rows = joint_task_linearity(loss, loss, w, w, [0.0, 0.3, 1.0], 5.0, 5.0)
    assert all(row["delta"] == pytest.approx(0.0, abs=1e-12) and row["bound"] == 0.0 for row in rows)


def test_joint_task_linearity_equals_its_second_order_form_on_quadratics():
    loss_s, hessian_s, _, _ = quadratic(EIGENVALUES, seed=0, centre_seed=1)
    loss_t, hessian_t, _, _ = quadratic([3.0, 1.0, 1.0, 0.5, 0.2, 0.1, 0.05], seed=2, centre_seed=3)
    generator = torch.Generator().manual_seed(6)
    w_s, w_t = (torch.randn(7, generator=generator, dtype=torch.float64) for _ in range(2))
    v = w_t - w_s
    rows = joint_task_linearity(loss_s, loss_t, unflat(w_s), unflat(w_t), [0.0, 0.25, 0.5, 1.0], 5.0, 3.0)
    for row in rows:
        alpha = row["alpha"]
        exact = -0.5 * alpha * (1 - alpha) * float(v @ (hessian_s + hessian_t) @ v)  # no remainder
        assert row["delta"] == pytest.approx(exact, abs=1e-9)
        assert abs(row["delta"]) <= row["bound"] + 1e-12
        assert row["bound"] == pytest.approx(0.5 * alpha * (1 - alpha) * 8.0 * float(v @ v))


def test_task_loss_is_the_evaluated_loss_and_its_gradient_is_the_modules(toy_backbone, toy_data):
    features, labels = toy_data
    head = {"weight": torch.randn(3, 6, generator=torch.Generator().manual_seed(7)), "bias": torch.zeros(3)}
    params = {name: value + 0.1 for name, value in toy_backbone.top_state().items()}  # not the loaded weights
    loss = task_loss(toy_backbone, head, features, labels)
    value = loss(params)
    toy_backbone.load_top_state(params)
    assert float(value) == pytest.approx(evaluate_head(toy_backbone, head, features, labels, "accuracy")["loss"],
                                         rel=1e-6)
    leaves = {name: p.clone().requires_grad_(True) for name, p in params.items()}
    functional = torch.autograd.grad(loss(leaves), list(leaves.values()))
    network = dict(toy_backbone.network.named_parameters())
    toy_backbone.network.zero_grad()
    logits = torch.nn.functional.linear(toy_backbone.top(*features), head["weight"], head["bias"])
    torch.nn.functional.cross_entropy(logits, labels).backward()
    for name, grad in zip(leaves, functional):
        assert torch.allclose(grad, network[name].grad, atol=1e-6), name
    assert hessian_max_eigenvalue(loss, params, iterations=50) > 0  # cross-entropy on a ReLU net: PSD part


def test_long_loops_log_how_far_they_are_with_a_rate_and_an_eta():
    import time

    from dpmerge.runtime import progress

    line = progress(2, 4, time.perf_counter() - 2.0)  # two of four tasks done in two seconds
    assert line.startswith("2/4, 2.0s, 1.00/s, eta 2s"), line
