"""Per-example clipped gradient sums by a loop over examples: what every per-sample strategy is held to."""

import torch
import torch.nn.functional as F

from dpmerge.training.dp_step import (
    clipped_gradient_sum,
)
from dpmerge.training.persample import make_clipper


def brute_force_clipped_sum(model, features, labels, clip_norm):
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for i in range(labels.shape[0]):
        grads = torch.autograd.grad(
            F.cross_entropy(model(*(f[i : i + 1] for f in features)), labels[i : i + 1], reduction="sum"), params
        )
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        factor = min(1.0, clip_norm / norm.item())
        total = [t + factor * g for t, g in zip(total, grads)]
    return total


def assert_matches_brute_force(model, features, labels, clip_norm, strategy):
    model.train()
    expected = brute_force_clipped_sum(model, features, labels, clip_norm)
    clipper = make_clipper(model, strategy)
    try:
        actual = clipped_gradient_sum(clipper, features, labels, clip_norm)
    finally:
        clipper.close()
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert torch.allclose(a, e, atol=1e-5, rtol=1e-4), (a - e).abs().max()


def per_example_norms(model, features, labels):
    return [
        torch.sqrt(sum(s.pow(2).sum() for s in brute_force_clipped_sum(
            model, tuple(f[i : i + 1] for f in features), labels[i : i + 1], float("inf")))).item()
        for i in range(labels.shape[0])
    ]
