"""DPSAT (Park et al., "Differentially Private Sharpness-Aware Training", ICML 2023): the SAM ascent follows the
previous step's privatized gradient, so a step makes one query; checked against hand computation and the
accountant (a killed DPSAT run resumes bit-identically: tests/test_dp.py)."""

import math

import pytest
import torch

from brute_force import brute_force_clipped_sum
from conftest import keyed
from dpmerge.methods import METHODS
from dpmerge.models.base import TaskModel
from dpmerge.privacy.randomness import GeneratorStream
from dpmerge.training.dp_step import adamw, method_update, privatized_gradient
from dpmerge.training.finetune import FinetuneConfig, train
from dpmerge.training.persample import make_clipper


def _norm(tensors):
    return torch.sqrt(sum((t * t).sum() for t in tensors))


@pytest.mark.parametrize("method", ["dp_sat", "dp_sat_anchor"])
def test_two_dpsat_steps_match_hand_computation_with_the_noise_in_the_ascent(toy_backbone, toy_data, method):
    features, labels = toy_data
    batches = [(tuple(f[:10] for f in features), labels[:10]), (tuple(f[10:22] for f in features), labels[10:22])]
    model = TaskModel(toy_backbone, 3)
    model.train()
    clipper = make_clipper(model, "functorch")
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() - 0.1 for p in params]
    anchors[-1] = None  # the head has no pretrained value
    clip, sigma, batch, rho, lam = 0.3, 0.8, 10.0, 0.05, 0.5
    anchor_lambda = lam if METHODS[method].anchor else 0.0
    noise = GeneratorStream(torch.Generator().manual_seed(7))
    replayed = GeneratorStream(torch.Generator().manual_seed(7))  # the same draws, for the hand computation
    queries = []

    def query(f, y):
        queries.append(len(y))
        return privatized_gradient(clipper, f, y, clip_norm=clip, noise_multiplier=sigma, expected_batch_size=batch,
                                   noise=noise)

    def by_hand(f, y):
        summed = brute_force_clipped_sum(model, f, y, clip)
        return [(s + sigma * clip * replayed.normal(s.shape, s.dtype, s.device)) / batch for s in summed]

    def anchored(g, w):
        return [x + (0 if w0 is None else 2 * anchor_lambda * (wi - w0)) for x, wi, w0 in zip(g, w, anchors)]

    memory = {}
    # step 1: nothing to ascend along yet, so the query is at w
    w1 = [p.detach().clone() for p in params]
    update1 = method_update(METHODS[method], query, params, anchors, *batches[0], memory, rho=rho, anchor_lambda=lam)
    g1 = by_hand(*batches[0])
    for u, e in zip(update1, anchored(g1, w1)):
        assert torch.allclose(u, e, atol=1e-6)
    for m, g in zip(memory["previous_gradient"], g1):  # the privatized gradient, without the anchor
        assert torch.allclose(m, g, atol=1e-6)

    with torch.no_grad():  # any optimizer step in between
        for p, u in zip(params, update1):
            p.sub_(0.05 * u)
    w2 = [p.detach().clone() for p in params]
    update2 = method_update(METHODS[method], query, params, anchors, *batches[1], memory, rho=rho, anchor_lambda=lam)
    # step 2 by hand: eps = rho g1/||g1|| from step 1's noisy gradient, one query at w + eps on this step's batch
    with torch.no_grad():
        for p, g in zip(params, g1):
            p.add_(rho * g / _norm(g1))
    h2 = by_hand(*batches[1])
    with torch.no_grad():
        for p, w in zip(params, w2):
            p.copy_(w)
    for u, e in zip(update2, anchored(h2, w2)):
        assert torch.allclose(u, e, atol=1e-6)
    assert all(torch.equal(p.detach(), w) for p, w in zip(params, w2))  # the weights are restored exactly
    for m, h in zip(memory["previous_gradient"], h2):
        assert torch.allclose(m, h, atol=1e-6)
    assert queries == [10, 12]  # one query per step, each on its own batch
    # the ascent moved the query: the same batch at w (other noise) would not give this update
    unperturbed = anchored(by_hand(*batches[1]), w2)
    assert any(not torch.allclose(u, e, atol=1e-4) for u, e in zip(update2, unperturbed))


@pytest.mark.slow
def test_dpsat_is_accounted_at_one_query_per_step_with_dp_sgds_noise(toy_backbone, toy_data):
    """One query per step: DPSAT's sigma is naive DP's at the same target, and DP-SAM's is sqrt(2) times it."""
    features, labels = toy_data
    records = {}
    for method in ("naive_dp", "dp_sat", "dp_sat_anchor", "dp_sam"):
        config = FinetuneConfig(method=method, target_epsilon=3.0, epochs=1.0, batch_size=8, lr=1e-2, seed=2)
        records[method] = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None).record
    for method in ("dp_sat", "dp_sat_anchor"):
        record = records[method]
        assert record["queries_per_step"] == 1 and record["steps_by_queries"] == {"1": 8}
        assert record["noise_multiplier"] == pytest.approx(records["naive_dp"]["noise_multiplier"], rel=1e-9)
        assert record["effective_noise_multiplier"] == pytest.approx(record["noise_multiplier"], rel=1e-9)
        assert record["spent_epsilon"] == pytest.approx(records["naive_dp"]["spent_epsilon"], rel=1e-9)
        assert record["rho"] == pytest.approx(0.05)
    assert records["dp_sat"]["anchor_lambda"] == 0.0 and records["dp_sat_anchor"]["anchor_lambda"] > 0
    assert records["dp_sam"]["noise_multiplier"] == pytest.approx(
        math.sqrt(2) * records["dp_sat"]["noise_multiplier"], rel=1e-6)


@pytest.mark.parametrize("method", ["dp_sat", "dp_sat_anchor"])
def test_the_remembered_gradient_survives_the_optimizer_step_it_feeds(toy_backbone, toy_data, method):
    """DPSAT keeps g~_t without copying it (it is also the update AdamW reads, anchor added out of place): an
    optimizer that changed its gradients in place would silently move the next step's ascent."""
    features, labels = toy_data
    model = TaskModel(toy_backbone, 3)
    model.train()
    clipper = make_clipper(model, "bookkeeping")
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() - 0.1 for p in params[:-1]] + [None]
    optimizer = adamw(params, lr=1e-2, weight_decay=0.01)  # the pipeline's (fused) optimizer
    noise = GeneratorStream(torch.Generator().manual_seed(3))

    def query(f, y):
        return privatized_gradient(clipper, f, y, clip_norm=0.3, noise_multiplier=0.8, expected_batch_size=10.0,
                                   noise=noise)

    memory = {}
    for step in range(3):
        batch = (tuple(f[10 * step:10 * step + 10] for f in features), labels[10 * step:10 * step + 10])
        update = method_update(METHODS[method], query, params, anchors, *batch, memory, rho=0.05, anchor_lambda=0.5)
        remembered = [g.clone() for g in memory["previous_gradient"]]
        for p, u in zip(params, update):
            p.grad = u
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert all(torch.equal(g, r) for g, r in zip(memory["previous_gradient"], remembered))
    if METHODS[method].anchor:  # the anchor went on a copy: update and remembered gradient differ
        assert not all(torch.equal(u, g) for u, g in zip(update, memory["previous_gradient"]))
