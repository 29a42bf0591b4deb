"""RegMean Grams and Fisher diagonals against per-example loops; clipping, noise and accounting of the private
mode (a Poisson-subsampled Gaussian step, composed with the fine-tuning)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpmerge.models.base import Backbone
from dpmerge.privacy.accounting import calibrate_noise_multiplier, composed_epsilon, spent_epsilon
from dpmerge.privacy.randomness import GeneratorStream
from dpmerge.privacy.statistics import fisher_statistics, gram_statistics, regmean_layers


class ToyBackbone(Backbone):
    """Tokens (B, T, 4) with a padding mask -> Linear -> tanh -> Linear -> masked mean; a frozen Linear too."""

    kind = "toy"
    modality = "text"
    embed_dim = 3

    def __init__(self):
        torch.manual_seed(0)
        self.network = nn.ModuleDict({"first": nn.Linear(4, 5), "second": nn.Linear(5, 3), "frozen": nn.Linear(4, 4)})
        self.network.frozen.requires_grad_(False)

    def token_weights(self, tokens, mask):
        return mask

    def top(self, tokens, mask):
        hidden = self.network.second(torch.tanh(self.network.first(self.network.frozen(tokens))))
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


def toy_features(count=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randn(count, 3, 4, generator=generator)
    mask = torch.ones(count, 3)
    mask[::2, 2] = 0  # every other example has a padded last position
    return tokens, mask


def per_example_inputs(backbone, tokens, mask):
    net = backbone.network
    first = net.frozen(tokens) * mask[..., None]
    second = torch.tanh(net.first(net.frozen(tokens))) * mask[..., None]
    return {"first.weight": first, "second.weight": second}


def test_regmean_layers_are_the_trainable_linear_and_pointwise_layers():
    assert set(regmean_layers(ToyBackbone())) == {"first.weight", "second.weight"}


def test_gram_statistics_equal_the_mean_of_per_example_grams_over_real_tokens():
    backbone = ToyBackbone()
    tokens, mask = toy_features()
    grams = gram_statistics(backbone, (tokens, mask), batch_size=4)
    for key, x in per_example_inputs(backbone, tokens, mask).items():
        expected = sum(x[e].T @ x[e] for e in range(len(x))) / len(x)
        assert torch.allclose(grams[key], expected, atol=1e-5), key


def test_clipped_grams_bound_every_examples_joint_contribution():
    backbone = ToyBackbone()
    tokens, mask = toy_features()
    clip = 0.3
    grams = gram_statistics(backbone, (tokens, mask), clip_norm=clip, batch_size=4)
    inputs = per_example_inputs(backbone, tokens, mask)
    expected = {key: 0 for key in inputs}
    for e in range(len(tokens)):
        contributions = {key: x[e].T @ x[e] for key, x in inputs.items()}
        norm = torch.sqrt(sum(c.square().sum() for c in contributions.values()))
        assert norm > clip  # the bound binds here
        for key, c in contributions.items():
            expected[key] = expected[key] + c * clip / norm
    for key in inputs:
        assert torch.allclose(grams[key], expected[key] / len(tokens), atol=1e-6)


def test_private_grams_get_symmetric_noise_of_the_calibrated_scale():
    backbone = ToyBackbone()
    features = toy_features(count=4)
    clean = gram_statistics(backbone, features, clip_norm=1.0)
    draws = torch.stack([
        gram_statistics(backbone, features, clip_norm=1.0, noise_multiplier=2.0,
                        noise=GeneratorStream(torch.Generator().manual_seed(s)))["second.weight"] for s in range(300)
    ])
    noise = (draws - clean["second.weight"]) * 4  # undo the mean over 4 examples
    assert torch.allclose(noise, noise.transpose(1, 2))
    off_diagonal = noise[:, 0, 1]
    assert off_diagonal.std().item() == pytest.approx(2.0 / np.sqrt(2), rel=0.15)  # (Z + Z^T)/2 off-diagonal
    assert noise[:, 0, 0].std().item() == pytest.approx(2.0, rel=0.15)


def test_fisher_statistics_equal_the_expected_fisher_by_autograd_per_example():
    backbone = ToyBackbone()
    tokens, mask = toy_features(count=5)
    head = {"weight": torch.randn(4, 3, generator=torch.Generator().manual_seed(3)), "bias": torch.zeros(4)}
    fishers = fisher_statistics(backbone, head, (tokens, mask), batch_size=2)
    params = dict(backbone.network.named_parameters())
    expected = {name: torch.zeros_like(p) for name, p in params.items() if p.requires_grad}
    for e in range(len(tokens)):
        logits = F.linear(backbone.top(tokens[e:e + 1], mask[e:e + 1]), head["weight"], head["bias"])
        log_probs = F.log_softmax(logits, -1)[0]
        for label in range(4):
            grads = torch.autograd.grad(log_probs[label], [params[n] for n in expected], retain_graph=True)
            for name, g in zip(expected, grads):
                expected[name] += log_probs[label].exp().detach() * g.square() / len(tokens)
    assert set(fishers) == set(expected)
    for name in expected:
        assert torch.allclose(fishers[name], expected[name], rtol=1e-4, atol=1e-7), name


def test_clipped_fisher_bounds_each_example_and_noise_stays_non_negative():
    backbone = ToyBackbone()
    features = toy_features(count=4)
    head = {"weight": torch.randn(2, 3, generator=torch.Generator().manual_seed(3)), "bias": torch.zeros(2)}
    clip = 1e-4
    clipped = fisher_statistics(backbone, head, features, clip_norm=clip)
    total = torch.sqrt(sum(f.square().sum() for f in clipped.values())) * 4
    assert total <= 4 * clip * (1 + 1e-5)  # the sum of 4 contributions of norm <= clip
    noisy = fisher_statistics(backbone, head, features, clip_norm=clip, noise_multiplier=5.0,
                              noise=GeneratorStream(torch.Generator().manual_seed(0)))
    assert all((f >= 0).all() for f in noisy.values())
    assert any((f == 0).any() for f in noisy.values())  # noise made some negative, clamped


def test_private_statistic_is_a_poisson_subsampled_gaussian_composed_with_fine_tuning():
    """m = 256 expected examples of N = 300, one step at q = m/N: the calibrated sigma meets epsilon = 1 by an
    independent accountant (Google's dp_accounting RDP), where a fixed-size subset accounted at q = 1 with
    sensitivity C would have claimed 1.0 while spending more under add/remove neighbours."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    delta, num_examples, expected = 1 / 300, 300, 256
    q = expected / num_examples
    statistic_sigma = calibrate_noise_multiplier(1.0, delta, q, 1, accountant="rdp", neighbouring="add_remove")
    independent = rdp_privacy_accountant.RdpAccountant()
    independent.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(statistic_sigma)), 1)
    assert independent.get_epsilon(delta) <= 1.0 * (1 + 1e-3)
    alone = spent_epsilon(statistic_sigma, q, 1, delta, 1, "rdp", "add_remove")
    assert 0.99 < alone <= 1.0
    sigma = calibrate_noise_multiplier(4.0, delta, 0.05, 200, accountant="rdp", neighbouring="add_remove")
    finetune = spent_epsilon(sigma, 0.05, 200, delta, 1, "rdp", "add_remove")
    total = composed_epsilon([(sigma, 0.05, 200), (statistic_sigma, q, 1)], delta, "rdp", "add_remove")
    assert max(finetune, alone) < total <= finetune + alone  # composition costs, but less than the sum
    assert composed_epsilon([(sigma, 0.05, 200)], delta, "rdp", "add_remove") == pytest.approx(finetune)


def test_a_private_statistic_normalises_by_the_expected_count_and_survives_an_empty_sample():
    backbone = ToyBackbone()
    tokens, mask = toy_features(count=4)
    by_count = gram_statistics(backbone, (tokens, mask), clip_norm=1.0)
    by_expected = gram_statistics(backbone, (tokens, mask), clip_norm=1.0, normaliser=8.0)
    assert all(torch.allclose(by_expected[k], by_count[k] / 2) for k in by_count)  # 4 sampled, 8 expected
    # a Poisson sample can be empty: every layer's statistic is still released, as noise only
    empty = gram_statistics(backbone, (tokens[:0], mask[:0]), clip_norm=1.0, noise_multiplier=1.0,
                            noise=GeneratorStream(torch.Generator().manual_seed(0)), normaliser=8.0)
    assert {k: v.shape for k, v in empty.items()} == {k: v.shape for k, v in by_count.items()}
    assert all(v.abs().sum() > 0 for v in empty.values())
