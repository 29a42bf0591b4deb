"""The DP step: per-sample clipping against a brute-force loop, Eq. (4)-(7) against hand computation."""

import math
from dataclasses import replace

import pytest
import torch

from brute_force import assert_matches_brute_force, brute_force_clipped_sum
from conftest import ToyBackbone, build_backbones_with, keyed
from dpmerge.artifacts import file_tensors_sha256, read_metadata, tensors_sha256
from dpmerge.methods import METHODS
from dpmerge.models.base import TaskModel
from dpmerge.models.registry import load_backbone
from dpmerge.privacy.gaussian_mechanism import poisson_batch
from dpmerge.privacy.randomness import GeneratorStream
from dpmerge.stages.prepare import pretrained
from dpmerge.training.dp_step import (
    STEPS,
    adamw,
    add_anchor,
    clipped_gradient_sum,
    method_update,
    perturbed,
    privatized_gradient,
    sam_scale,
)
from dpmerge.training.finetune import FinetuneConfig, train
from dpmerge.training.persample import STRATEGIES, make_clipper


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("clip_norm", [1e-3, 0.2, 1e3])  # all clipped, mixed, none clipped
def test_clipped_sum_matches_per_example_loop_on_toy_model(toy_backbone, toy_data, clip_norm, strategy):
    features, labels = toy_data
    model = TaskModel(toy_backbone, 3)
    assert_matches_brute_force(model, tuple(f[:7] for f in features), labels[:7], clip_norm, strategy)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "kind,inputs",
    [
        ("efficientnet_lite0", torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))),
        ("minilm_l6", ["a short sentence", "another, slightly longer sentence here", "x"]),
    ],
)
def test_clipped_sum_matches_per_example_loop_on_real_backbone_tops(kind, inputs, strategy):
    """Rule 5: the DP-adapted real layers (folded BN, BERT attention under vmap) give exact per-sample grads."""
    options = {"trainable_blocks": 1} if kind == "efficientnet_lite0" else {"trainable_blocks": 1, "max_length": 12}
    backbone = load_backbone(kind, **options)
    features = backbone.trunk_features(inputs)
    labels = torch.tensor([0, 1, 1])
    assert_matches_brute_force(TaskModel(backbone, 2), features, labels, clip_norm=0.5, strategy=strategy)


def test_privatized_gradient_noise_has_std_sigma_c_over_b(toy_backbone, toy_data):
    features, labels = toy_data
    model = TaskModel(toy_backbone, 3)
    model.train()
    model = make_clipper(model, "bookkeeping")
    empty = labels[:0]
    sigma, clip, batch = 2.0, 0.5, 8.0
    draws = torch.cat(
        [
            torch.cat([g.flatten() for g in privatized_gradient(
                model, tuple(f[:0] for f in features), empty, clip_norm=clip, noise_multiplier=sigma,
                expected_batch_size=batch, noise=GeneratorStream(torch.Generator().manual_seed(seed)))])
            for seed in range(20)
        ]
    )
    # an empty Poisson batch still releases pure noise N(0, (sigma C / B)^2)
    assert draws.mean().abs() < 0.02
    assert draws.std().item() == pytest.approx(sigma * clip / batch, rel=0.03)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dp_merging_update_without_noise_equals_hand_computed_sam_plus_anchor(toy_backbone, toy_data, strategy):
    features, labels = toy_data
    features, labels = tuple(f[:10] for f in features), labels[:10]
    model = TaskModel(toy_backbone, 3)
    model.train()
    per_sample = make_clipper(model, strategy)
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() - 0.1 for p in params]  # w0 = w - 0.1 so the anchor is visible
    anchors[-1] = None  # the head has no pretrained value: no anchor
    clip, rho, lam, batch = 0.3, 0.05, 0.5, 10.0

    def noiseless_query(f, y):
        return [s / batch for s in clipped_gradient_sum(per_sample, f, y, clip)]

    update = method_update(METHODS["dp_merging"], noiseless_query, params, anchors, features, labels, rho=rho,
                           anchor_lambda=lam)

    # by hand: g at w; eps = rho g/||g||; h at w + eps on the same batch; h + 2 lam (w - w0)
    before = [p.detach().clone() for p in params]
    g = [s / batch for s in brute_force_clipped_sum(model, features, labels, clip)]
    g_norm = torch.sqrt(sum((x * x).sum() for x in g))
    with torch.no_grad():
        for p, x in zip(params, g):
            p.add_(rho * x / g_norm)
    h = [s / batch for s in brute_force_clipped_sum(model, features, labels, clip)]
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
    expected = [hh + (0 if w0 is None else 2 * lam * (b - w0)) for hh, b, w0 in zip(h, before, anchors)]
    for u, e in zip(update, expected):
        assert torch.allclose(u, e, atol=1e-6)
    # weights are restored after the perturbed query
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
    # the SAM step really differs from a plain gradient at w
    assert any(not torch.allclose(hh, gg, atol=1e-7) for hh, gg in zip(h, g))


def test_anchor_is_added_after_privatization_not_to_the_loss(toy_backbone, toy_data):
    """With C -> 0 every per-sample term vanishes; an anchor put in the loss would vanish with it."""
    features, labels = toy_data
    model = TaskModel(toy_backbone, 3)
    model.train()
    per_sample = make_clipper(model, "functorch")
    params = [p for p in model.parameters() if p.requires_grad]
    anchors = [p.detach().clone() + 1.0 for p in params]
    lam = 0.05

    def query(f, y):
        return privatized_gradient(per_sample, f, y, clip_norm=1e-9, noise_multiplier=0.0,
                                   expected_batch_size=16, noise=GeneratorStream(torch.Generator()))

    update = method_update(METHODS["dp_anchor"], query, params, anchors, tuple(f[:16] for f in features), labels[:16],
                           rho=0.0, anchor_lambda=lam)
    for u in update:
        assert torch.allclose(u, torch.full_like(u, -2 * lam), atol=1e-6)  # 2 lam (w - w0) with w0 = w + 1


def test_sam_perturbation_has_norm_rho_and_is_zero_for_zero_gradient():
    """Eq. (5) as the step applies it: perturbed() moves the weights by sam_scale(g) * g."""
    g = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]
    params = [torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.nn.Parameter(torch.tensor([[-1.0]]))]
    before = [p.detach().clone() for p in params]
    with perturbed(params, g, sam_scale(g, 0.5)):
        eps = [p.detach() - w for p, w in zip(params, before)]
    assert math.isclose(torch.sqrt(sum((e * e).sum() for e in eps)).item(), 0.5, rel_tol=1e-6)
    zero = [torch.zeros(2), torch.zeros(1, 1)]
    assert sam_scale(zero, 0.5) == 0.0
    with perturbed(params, zero, sam_scale(zero, 0.5)):
        assert all(torch.equal(p.detach(), w) for p, w in zip(params, before))
    assert all(torch.equal(p.detach(), w) for p, w in zip(params, before))  # restored after the ascent


def test_anchor_formula_and_no_anchor_for_the_head():
    params = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
    update = add_anchor([torch.tensor([1.0, 1.0]), torch.tensor([1.0])], params, [torch.tensor([0.0, 4.0]), None], 0.25)
    assert torch.allclose(update[0], torch.tensor([1.5, 0.0]))  # 1 + 2 * 0.25 * (w - w0)
    assert torch.equal(update[1], torch.tensor([1.0]))


def test_the_fused_optimizer_takes_adamws_steps():
    """adamw() uses torch's fused kernel on the CPU; its steps are AdamW's (decoupled decay, bias correction), to
    float32 rounding, whatever the gradients: checked against torch's single-tensor AdamW over a few steps."""
    generator = torch.Generator().manual_seed(5)
    start = [torch.randn(33, 7, generator=generator), torch.randn(5, generator=generator)]
    grads = [[torch.randn(t.shape, generator=generator) for t in start] for _ in range(6)]
    fused = [t.clone().requires_grad_() for t in start]
    reference = [t.clone().requires_grad_() for t in start]
    optimizers = (adamw(fused, lr=0.05, weight_decay=0.3, betas=(0.8, 0.95)),
                  torch.optim.AdamW(reference, lr=0.05, weight_decay=0.3, betas=(0.8, 0.95), foreach=False))
    assert optimizers[0].defaults["fused"]
    for step in grads:
        for params, optimizer in zip((fused, reference), optimizers):
            for p, g in zip(params, step):
                p.grad = g.clone()
            optimizer.step()
    for f, r, s in zip(fused, reference, start):
        assert not torch.allclose(f, s)  # it moved
        assert torch.allclose(f, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(METHODS))
def test_each_step_function_makes_as_many_queries_as_the_accountant_charges(name, toy_backbone, toy_data):
    """The accountant charges METHODS[name].queries_per_step; the step function must make exactly that many."""
    assert set(STEPS) == set(METHODS)
    features, labels = toy_data
    model = TaskModel(toy_backbone, 3)
    params = [p for p in model.parameters() if p.requires_grad]
    calls = []

    def query(f, y):
        calls.append(len(y))
        return [torch.ones_like(p) for p in params]

    before = [p.detach().clone() for p in params]
    update = method_update(METHODS[name], query, params, [p.detach() - 1 for p in params], features, labels,
                           rho=0.05, anchor_lambda=0.5)
    assert calls == [labels.numel()] * METHODS[name].queries_per_step  # same batch every time
    anchored = METHODS[name].anchor
    assert all(torch.allclose(u, torch.full_like(u, 2.0 if anchored else 1.0)) for u in update)
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))


def test_poisson_batches_vary_in_size_with_mean_qn():
    sampler = GeneratorStream(torch.Generator().manual_seed(0))
    sizes = [poisson_batch(1000, 0.02, sampler).numel() for _ in range(400)]
    assert len(set(sizes)) > 5
    assert sum(sizes) / len(sizes) == pytest.approx(20, rel=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["naive_dp", "dp_merging", "dp_sam", "dp_anchor", "dp_sat", "dp_sat_anchor"])
def test_finetune_releases_a_complete_record_within_budget(toy_backbone, toy_data, method):
    features, labels = toy_data
    pretrained = toy_backbone.top_state()
    config = FinetuneConfig(method=method, target_epsilon=2.0, epochs=1.0, batch_size=8, lr=1e-2, seed=3)
    result = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    record = result.record
    assert record["steps"] == 8 and record["sample_rate"] == pytest.approx(8 / 64)
    assert record["queries_per_step"] == METHODS[method].queries_per_step
    # what ran, as counted by the loop: every one of the 8 steps made the method's queries on its batch
    assert record["steps_by_queries"] == {str(METHODS[method].queries_per_step): 8}
    assert record["randomness"] == "keyed" and record["neighbouring"] == "replace_one" and record["seed"] == 3
    assert record["accountant"] == "pld" and record["num_train_examples"] == 64 and record["public_n"] is None
    assert record["delta"] == pytest.approx(1 / 64)
    assert 0 < record["spent_epsilon"] <= 2.0
    assert record["effective_noise_multiplier"] == pytest.approx(
        record["noise_multiplier"] / math.sqrt(record["queries_per_step"])
    )
    assert set(result.task_vector) == set(toy_backbone.trainable_names())
    assert any(v.abs().sum() > 0 for v in result.task_vector.values())
    # the shared backbone is left at w0
    after = toy_backbone.top_state()
    assert all(torch.equal(after[name], pretrained[name]) for name in pretrained)


@pytest.mark.slow
def test_finetune_is_deterministic_given_the_key_and_identity(toy_backbone, toy_data):
    features, labels = toy_data
    config = FinetuneConfig(method="dp_merging", target_epsilon=4.0, epochs=0.5, batch_size=8, lr=1e-2, seed=1)
    first = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    second = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    for key in first.task_vector:
        assert torch.equal(first.task_vector[key], second.task_vector[key])


@pytest.mark.slow
def test_head_lr_moves_only_the_head_faster_and_leaves_unset_runs_as_they_were(toy_backbone, toy_data):
    """finetune.head_lr gives the head its own AdamW rate (here 10 x lr: the head moves further); a run without
    it keeps the identity, and so the randomness, it had before the setting existed, and a run with it is another
    mechanism with randomness of its own."""
    from dpmerge.training.finetune import finetune_identity

    features, labels = toy_data
    base = FinetuneConfig(method="naive_dp", target_epsilon=4.0, epochs=0.5, batch_size=8, lr=1e-2, seed=1)
    plain = train(toy_backbone, 3, features, labels, base, **keyed(), log=lambda _: None)
    assert "head_lr" not in finetune_identity(base, {}, "sha")["settings"]
    assert finetune_identity(replace(base, head_lr=0.1), {}, "sha")["settings"]["head_lr"] == 0.1
    fast = train(toy_backbone, 3, features, labels, replace(base, head_lr=0.1), **keyed(), log=lambda _: None)
    assert any(not torch.equal(fast.head[k], plain.head[k]) for k in plain.head)
    assert sum(float(v.abs().sum()) for v in fast.head.values()) > sum(float(v.abs().sum())
                                                                      for v in plain.head.values())


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(ValueError, match="known methods: nonprivate, naive_dp, dp_sam, dp_anchor, dp_merging"):
        FinetuneConfig(method="dpsgd", target_epsilon=1.0)


class Killed(Exception):
    pass


# dp_sat_anchor: DPSAT's ascent at step t needs step t-1's gradient, so its checkpoint must keep it
@pytest.mark.slow
@pytest.mark.parametrize("method,rng", [("dp_merging", "keyed"), ("dp_merging", "secure"), ("dp_sat_anchor", "keyed")])
def test_killed_run_resumes_bit_identically_without_spending_twice(toy_backbone, toy_data, tmp_path, method, rng):
    features, labels = toy_data
    config = FinetuneConfig(method=method, target_epsilon=4.0, epochs=2.0, batch_size=8, lr=1e-2,
                            seed=5, log_every=1, rng=rng)
    reference = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    checkpoint = tmp_path / "run.ckpt"

    def kill_at_step_8(message):
        if "step 8/16" in message:
            raise Killed

    with pytest.raises(Killed):
        train(toy_backbone, 3, features, labels, config, **keyed(), log=kill_at_step_8, checkpoint=checkpoint,
                 checkpoint_every=3)
    assert checkpoint.exists() and checkpoint.stat().st_mode & 0o077 == 0  # private: it holds the generators
    memory = torch.load(checkpoint, weights_only=True)["memory"]
    if METHODS[method].one_query:
        assert len(memory["previous_gradient"]) == len(reference.task_vector) + len(reference.head)
    messages = []
    resumed = train(toy_backbone, 3, features, labels, config, **keyed(), log=messages.append, checkpoint=checkpoint,
                       checkpoint_every=3)
    assert any("resumed from" in m and "at step 6/16" in m for m in messages)
    assert resumed.record == reference.record  # same steps, sigma and spent epsilon: nothing spent twice
    for key in reference.task_vector:
        assert torch.equal(resumed.task_vector[key], reference.task_vector[key])
    for key in reference.head:
        assert torch.equal(resumed.head[key], reference.head[key])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["foreign", "corrupt"])
def test_foreign_or_corrupt_checkpoint_is_refused_and_training_restarts_clean(toy_backbone, toy_data, tmp_path, kind):
    features, labels = toy_data
    config = FinetuneConfig(method="naive_dp", target_epsilon=4.0, epochs=1.0, batch_size=8, lr=1e-2, seed=2)
    reference = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    checkpoint = tmp_path / "run.ckpt"
    if kind == "corrupt":
        checkpoint.write_bytes(b"not a checkpoint")
    else:
        other = FinetuneConfig(method="naive_dp", target_epsilon=4.0, epochs=1.0, batch_size=8, lr=1e-2, seed=9)

        def kill_at_step_5(message):
            if "step 5/8" in message:
                raise Killed

        with pytest.raises(Killed):
            train(toy_backbone, 3, features, labels, replace(other, log_every=1), **keyed(), log=kill_at_step_5,
                     checkpoint=checkpoint, checkpoint_every=2)
        assert checkpoint.exists()
    messages = []
    result = train(toy_backbone, 3, features, labels, config, **keyed(), log=messages.append, checkpoint=checkpoint)
    # another seed index is another mechanism: other settings and other keyed streams
    expected = "unreadable" if kind == "corrupt" else "belongs to another run (differs in ['config', 'randomness'])"
    assert any(str(checkpoint) in m and expected in m for m in messages), messages
    for key in reference.task_vector:
        assert torch.equal(result.task_vector[key], reference.task_vector[key])


@pytest.mark.slow
def test_checkpoint_of_another_noise_layout_restarts_clean(toy_backbone, toy_data, tmp_path, monkeypatch):
    """A checkpoint holds each generator's state; one written when the streams had another number of generators
    (an older version) cannot resume them, and is named as such instead of failing on the state's shape."""
    from dpmerge.privacy import randomness

    features, labels = toy_data
    config = FinetuneConfig(method="naive_dp", target_epsilon=4.0, epochs=1.0, batch_size=8, lr=1e-2, seed=2,
                            log_every=1)
    reference = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    checkpoint = tmp_path / "run.ckpt"

    def kill_at_step_5(message):
        if "step 5/8" in message:
            raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(randomness, "NOISE_GENERATORS", 1)
        with pytest.raises(Killed):
            train(toy_backbone, 3, features, labels, config, **keyed(), log=kill_at_step_5, checkpoint=checkpoint,
                     checkpoint_every=2)
    assert torch.load(checkpoint, weights_only=True)["noise"].dim() == 1  # one generator's state
    messages = []
    result = train(toy_backbone, 3, features, labels, config, **keyed(), log=messages.append, checkpoint=checkpoint)
    assert any("belongs to another run (differs in ['random_streams'])" in m for m in messages), messages
    for key in reference.task_vector:
        assert torch.equal(result.task_vector[key], reference.task_vector[key])


@pytest.mark.slow
def test_delta_up_to_one_over_n_is_accepted_and_above_it_refused(toy_backbone, toy_data):
    features, labels = toy_data
    for delta in (1 / 64, 1e-5):  # the default's 1/N, given explicitly, and a smaller one
        config = FinetuneConfig(method="naive_dp", target_epsilon=4.0, batch_size=8, epochs=0.25, delta=delta)
        assert train(toy_backbone, 3, features, labels, config, **keyed(),
                        log=lambda _: None).record["delta"] == delta
    config = FinetuneConfig(method="naive_dp", target_epsilon=4.0, batch_size=8, delta=1.5 / 64)
    with pytest.raises(ValueError, match=r"finetune.delta must be in \(0, 1/N\] = \(0, 0.015625\] for N = 64"):
        train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)


@pytest.mark.slow
def test_the_release_check_counts_the_queries_that_ran_and_refuses_an_extra_one(toy_backbone, toy_data, monkeypatch):
    """The spent epsilon comes from the queries the loop counted, not from the method's declared count: a step
    function that queries its batch once more than declared is caught before anything is released."""
    features, labels = toy_data
    config = FinetuneConfig(method="naive_dp", target_epsilon=4.0, epochs=1.0, batch_size=8, lr=1e-2)
    honest = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    assert honest.record["steps_by_queries"] == {"1": 8}

    def leaky_step(query, params, anchors, features, labels, memory):
        query(features, labels)  # a second look at the batch, e.g. a forgotten diagnostic
        return query(features, labels)

    monkeypatch.setitem(STEPS, "naive_dp", leaky_step)
    pretrained = toy_backbone.top_state()
    with pytest.raises(RuntimeError, match=r"refusing to release: the 8 steps that ran made \{2: 8\}.*> target 4.0"):
        train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    after = toy_backbone.top_state()
    assert all(torch.equal(after[name], pretrained[name]) for name in pretrained)  # nothing half-trained is left


def test_nonprivate_reference_records_infinite_epsilon(toy_backbone, toy_data):
    features, labels = toy_data
    config = FinetuneConfig(method="nonprivate", target_epsilon=None, epochs=1.0, batch_size=8, lr=1e-2)
    result = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    assert result.record["target_epsilon"] == "inf" and result.record["spent_epsilon"] == "inf"
    assert result.record["noise_multiplier"] == 0.0 and result.record["queries_per_step"] == 1
    assert any(v.abs().sum() > 0 for v in result.task_vector.values())


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"target_epsilon": 0.0}, "needs a target epsilon > 0"),
        ({"target_epsilon": -1.0}, "needs a target epsilon > 0"),
        ({"clip_norm": 0.0}, "finetune.clip_norm must be positive, got 0.0"),
        ({"batch_size": 0}, "finetune.batch_size must be positive, got 0"),
        ({"epochs": -1.0}, "finetune.epochs must be positive"),
        ({"betas": [0.9, 1.0]}, r"finetune.betas must be two numbers in \[0, 1\)"),
        ({"betas": [0.9]}, "finetune.betas"),
        ({"method": "dp_sharp"}, "unknown method 'dp_sharp'; known methods: nonprivate"),
        ({"head_lr": 0.0}, "finetune.head_lr must be positive, got 0.0"),
    ],
)
def test_bad_hyperparameters_fail_before_training(overrides, message):
    with pytest.raises(ValueError, match=message):
        FinetuneConfig(**{"method": "naive_dp", "target_epsilon": 4.0, **overrides})


def test_betas_from_a_json_list_become_a_tuple():
    assert FinetuneConfig(method="naive_dp", target_epsilon=4.0, betas=[0.8, 0.99]).betas == (0.8, 0.99)


def test_batch_larger_than_the_dataset_is_refused(toy_backbone, toy_data):
    features, labels = toy_data
    with pytest.raises(ValueError, match="batch_size 100 exceeds the 64 training examples"):
        train(toy_backbone, 3, features, labels,
                 FinetuneConfig(method="naive_dp", target_epsilon=4.0, batch_size=100),
                 **keyed())


@pytest.mark.slow
def test_a_head_only_run_trains_the_head_under_dp_and_leaves_w0_alone(toy_backbone, toy_data):
    """The Pretrained row's run: zero task vector, a head trained by DP-AdamW at the same budget, and the
    backbone's trainable flags back as they were."""
    features, labels = toy_data
    trainable_before = [p.requires_grad for p in toy_backbone.network.parameters()]
    config = FinetuneConfig(method="pretrained_head", target_epsilon=2.0, epochs=1.0, batch_size=8, lr=1e-2, seed=3)
    result = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    assert all(torch.count_nonzero(v) == 0 for v in result.task_vector.values())
    assert result.record["steps_by_queries"] == {"1": 8} and 0 < result.record["spent_epsilon"] <= 2.0
    initial = train(toy_backbone, 3, features, labels, replace(config, epochs=1e-9), **keyed(),
                       log=lambda _: None).head  # one step: close to the initial head
    assert any(not torch.allclose(result.head[k], initial[k]) for k in result.head)
    assert [p.requires_grad for p in toy_backbone.network.parameters()] == trainable_before


@pytest.mark.slow
def test_a_head_only_run_reads_w0s_top_once_and_trains_the_head_it_would_per_step(toy_backbone, toy_data, monkeypatch):
    """The head-only run applies the frozen top to the training set once; the head it releases is the one the
    per-step forward (the top at every step) trains from the same key."""
    import dpmerge.training.finetune as finetune_module

    features, labels = toy_data
    config = FinetuneConfig(method="pretrained_head", target_epsilon=2.0, epochs=2.0, batch_size=8, lr=1e-2, seed=3)
    top_calls = []
    top = toy_backbone.top
    monkeypatch.setattr(toy_backbone, "top", lambda *x: top_calls.append(len(x[0])) or top(*x))
    cached = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    assert top_calls == [len(labels)]  # one chunk of 64 examples, not one call per step
    monkeypatch.setattr(finetune_module, "head_only_inputs", lambda model, inputs, backbone: inputs)
    per_step = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    assert len(top_calls) > 16  # the 16 steps' forwards, and the logged losses
    assert cached.record == per_step.record
    assert all(torch.allclose(cached.head[k], per_step.head[k], atol=1e-6) for k in cached.head)


def test_a_head_only_run_with_a_frozen_zero_shot_head_touches_no_data(toy_backbone, toy_data):
    features, labels = toy_data
    head = {name: value.clone() for name, value in TaskModel(toy_backbone, 3).head.state_dict().items()}
    config = FinetuneConfig(method="pretrained_head", target_epsilon=2.0, epochs=1.0, batch_size=8, lr=1e-2, seed=3)
    result = train(toy_backbone, 3, features, labels, config, **keyed(), log=lambda _: None, head=head,
                      train_head=False)
    assert result.record["steps_by_queries"] == {} and result.record["spent_epsilon"] == 0.0
    assert all(torch.equal(result.head[k], head[k]) for k in head)
    assert all(torch.count_nonzero(v) == 0 for v in result.task_vector.values())


def test_the_w0_a_fine_tune_records_is_the_one_rule_pretrained_writes(tmp_path, toy_data, monkeypatch):
    """The merge checks its base against the w0_sha256 every vector records; that must be the hash of the file
    rule `pretrained` writes (built in another process, from the same checkpoint), not of anything else."""
    build_backbones_with(monkeypatch, lambda spec: ToyBackbone(tmp_path / "toy.bin"))
    pretrained(backbone="toy", backbone_spec={"kind": "toy"}, out=str(tmp_path / "w0.safetensors"))
    features, labels = toy_data
    config = FinetuneConfig(method="nonprivate", target_epsilon=None, epochs=1.0, batch_size=8, lr=1e-2)
    backbone = ToyBackbone(tmp_path / "toy.bin")
    w0 = backbone.top_state()
    result = train(backbone, 3, features, labels, config, **keyed(), log=lambda _: None)
    recorded, written = result.record["w0_sha256"], tmp_path / "w0.safetensors"
    assert recorded == file_tensors_sha256(written) == read_metadata(written)["w0_sha256"] == tensors_sha256(w0)
    assert recorded != tensors_sha256({k: w0[k] + result.task_vector[k] for k in w0})  # not the fine-tuned weights
