"""Data-dependent merge statistics, computed honestly: on public data, or privatized and accounted.

RegMean (Jin et al., ICLR 2023) needs, per linear layer and task, the Gram matrix X^T X of the layer's inputs
in the task's fine-tuned model; Fisher merging (Matena & Raffel, NeurIPS 2022) needs each task model's diagonal
Fisher information. Both come from data, so they are either

- computed on *public* data: a dataset the user declares public (`backbones.<name>.public_data`), outside
  every private training set, at no privacy cost. A held-out slice of a private training split is not public:
  its examples are people of the same private population; or
- computed on the task's *private* training data and privatized: a Poisson sample at rate q = m/N drawn from
  the study key (`private_sample`), each example's whole contribution (all layers' Gram contributions, or its
  Fisher contribution vector) clipped jointly to L2 norm C, Gaussian noise N(0, sigma^2 C^2) on every entry of
  the sum, and a mean over the expected count m = qN (data-independent, as a fine-tune's normaliser is). It is
  accounted as one Poisson-subsampled Gaussian step, composed with that task's fine-tuning by the same
  accountant (privacy.composed_epsilon); the total is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dpmerge.epsilon import NONPRIVATE_RECORDED
from dpmerge.models.base import Backbone, TaskModel
from dpmerge.privacy.accounting import (
    accounted_size,
    calibrate_noise_multiplier,
    composed_epsilon,
    record_mechanisms,
)
from dpmerge.privacy.gaussian_mechanism import clip_factors, poisson_batch
from dpmerge.privacy.randomness import MechanismRandomness

KINDS = ("gram", "fisher")


def statistic_identity(kind: str, release: dict, vector_sha256: str, settings: dict) -> dict:
    """Everything that makes one task's private statistic this mechanism: its kind and settings, and the release
    it is computed for (another method, budget, seed or sweep value of the same task is another mechanism)."""
    return {"mechanism": "merge_statistic", "kind": kind, "backbone": release.get("backbone"),
            "task": release["task"], "method": release["method"], "rho": release.get("rho"),
            "anchor_lambda": release.get("anchor_lambda"), "target_epsilon": release["target_epsilon"],
            "seed": release["seed"], "task_vector_sha256": vector_sha256, "settings": settings}


@dataclass
class PrivateSample:
    """What one task's privatized statistic draws and how it is accounted."""

    indices: torch.Tensor  # the Poisson sample of the private training set (secret: never recorded)
    normaliser: float  # the expected sample size qN, data-independent
    noise: object  # the secret noise stream (privacy/randomness.py)
    noise_multiplier: float
    record: dict  # the statistic's privacy record, with its total composed with the release's fine-tuning


def private_sample(kind: str, release: dict, vector_sha256: str, num_examples: int, examples: int,
                   clip_norm: float, epsilon: float, study_key: bytes) -> PrivateSample:
    """Sample, noise and accounting of a statistic of a release's private training data: a Poisson sample at rate
    q = examples/N from the study key, Gaussian noise calibrated to `epsilon` at the release's delta as one
    q-subsampled step (under the release's neighbouring relation), composed with the release's own steps.
    Under add/remove N differs between neighbours, so q comes from the public size the release declares."""
    population = num_examples
    size_name, size = accounted_size(release)
    if size_name == "public_n" and release["method"] != "nonprivate":
        if not size:
            raise ValueError(f"task {release['task']}: an add/remove release without privacy.public_n in its record "
                             "cannot have a private statistic (q would reveal N)")
        population = int(size)
    sample_rate = min(1.0, examples / population)
    settings = {"examples": examples, "clip_norm": clip_norm, "epsilon": epsilon}
    randomness = MechanismRandomness(study_key, statistic_identity(kind, release, vector_sha256, settings),
                                     release["randomness"])
    indices = poisson_batch(num_examples, sample_rate, randomness.stream("poisson_sampler"))
    record = {"examples": examples, "sample_rate": sample_rate, "clip_norm": clip_norm,
              "neighbouring": release["neighbouring"], "randomness": release["randomness"]}
    if release["method"] == "nonprivate":  # the non-private reference: clipped, no noise, nothing to account
        sigma = 0.0
        record.update(noise_multiplier=0.0, statistic_epsilon=NONPRIVATE_RECORDED, total_epsilon=NONPRIVATE_RECORDED)
    else:
        delta, accountant = float(release["delta"]), release["accountant"]
        sigma = calibrate_noise_multiplier(epsilon, delta, sample_rate, 1, 1, accountant, release["neighbouring"])
        record.update(noise_multiplier=sigma, steps=1, steps_by_queries={"1": 1}, delta=delta, accountant=accountant,
                      statistic_epsilon=epsilon, finetune_spent_epsilon=release["spent_epsilon"])
        record["total_epsilon"] = composed_epsilon(record_mechanisms(release) + record_mechanisms(record), delta,
                                                   accountant, release["neighbouring"])
    return PrivateSample(indices, sample_rate * population, randomness.stream("gaussian_noise"), sigma, record)


def regmean_layers(backbone: Backbone) -> dict[str, nn.Module]:
    """Trainable layers RegMean solves in closed form, by weight name: linear layers, and 1x1 convolutions
    (a linear layer applied at every position). Other trainable tensors are averaged."""
    layers = {}
    for name, module in backbone.network.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or not weight.requires_grad:
            continue
        pointwise = (isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and module.groups == 1
                     and module.stride == (1, 1) and module.padding in ((0, 0), "valid"))
        if isinstance(module, nn.Linear) or pointwise:
            layers[f"{name}.weight" if name else "weight"] = module
    return layers


def _input_rows(recorded: torch.Tensor, module: nn.Module, token_weights: torch.Tensor | None) -> torch.Tensor:
    """A layer's inputs as (B, positions, in): one row per token or spatial position, padding zeroed."""
    if isinstance(module, nn.Conv2d):
        rows = recorded.flatten(2).transpose(1, 2)
    else:
        rows = recorded.reshape(recorded.shape[0], -1, recorded.shape[-1])
    if token_weights is not None and rows.shape[1] == token_weights.shape[1]:
        rows = rows * token_weights[:, :, None].to(rows.dtype)
    return rows


def _noise_like(tensor: torch.Tensor, std: float, noise) -> torch.Tensor:
    return std * noise.normal(tensor.shape, tensor.dtype, tensor.device)


@torch.no_grad()
def gram_statistics(
    backbone: Backbone,
    features: tuple[torch.Tensor, ...],
    clip_norm: float | None = None,
    noise_multiplier: float = 0.0,
    noise=None,
    batch_size: int = 32,
    normaliser: float | None = None,
) -> dict[str, torch.Tensor]:
    """Mean over examples of each RegMean layer's input Gram sum_positions x x^T (backbone top as loaded).

    With clip_norm, example e's contributions {X_e^T X_e} over all layers are scaled jointly to Frobenius norm
    <= clip_norm (the norm via ||X^T X||_F = ||X X^T||_F, never forming per-example in x in matrices), and each
    summed Gram gets symmetric Gaussian noise of std noise_multiplier * clip_norm per entry (from the secret
    stream `noise`, privacy/randomness.py) before the mean. The sum is divided by `normaliser` (default: the number of
    examples; a private statistic passes its expected sample size).
    """
    layers = regmean_layers(backbone)
    recorded: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda m, args, out, key=key: recorded.__setitem__(key, args[0].detach()))
             for key, module in layers.items()]
    # Zeros first: a Poisson sample may be empty, and every layer's Gram must still be released (noise only).
    sums = {key: torch.zeros(m.weight.shape[1], m.weight.shape[1], device=backbone.device) for key, m in layers.items()}
    examples = features[0].shape[0]
    count = examples if normaliser is None else normaliser
    try:
        for start in range(0, examples, batch_size):
            batch = tuple(f[start:start + batch_size].to(backbone.device) for f in features)
            recorded.clear()
            backbone.top(*batch)
            weights = backbone.token_weights(*batch)
            rows = {key: _input_rows(recorded[key], layers[key], weights) for key in layers}
            if clip_norm is not None:
                squared = sum((x @ x.transpose(1, 2)).square().sum((1, 2)) for x in rows.values())
                scale = clip_factors(squared, clip_norm)
                rows = {key: x * scale.sqrt()[:, None, None] for key, x in rows.items()}
            for key, x in rows.items():
                flat = x.reshape(-1, x.shape[-1])
                sums[key] += flat.T @ flat
    finally:
        for hook in hooks:
            hook.remove()
    sums = {key: total.cpu() for key, total in sums.items()}  # noise is drawn on the CPU generator
    if clip_norm is not None and noise_multiplier > 0:
        for key, total in sums.items():
            drawn = _noise_like(total, noise_multiplier * clip_norm, noise)
            sums[key] = total + (drawn + drawn.T) / 2  # noise on every entry, symmetrised (post-processing)
    return {key: (total / count).cpu() for key, total in sums.items()}


def fisher_statistics(
    backbone: Backbone,
    head: dict[str, torch.Tensor],
    features: tuple[torch.Tensor, ...],
    clip_norm: float | None = None,
    noise_multiplier: float = 0.0,
    noise=None,
    batch_size: int = 16,
    normaliser: float | None = None,
) -> dict[str, torch.Tensor]:
    """Mean over examples of the diagonal Fisher of the task model (top as loaded + head) for every trainable
    top parameter: E_x sum_y p(y|x) (d log p(y|x) / d theta)^2, the expectation over the model's own predictive
    distribution taken exactly (no labels needed, so public data may be unlabelled).

    With clip_norm, each example's contribution vector (all parameters) is scaled to L2 norm <= clip_norm, and
    the sum gets Gaussian noise of std noise_multiplier * clip_norm per entry (from the secret stream `noise`);
    negative noisy values are set to 0 (post-processing). The sum is divided by `normaliser` (default: the
    number of examples).
    """
    if backbone.head_outputs(head) == 1:
        raise ValueError("Fisher merging needs a classification head: a regression head (STS-B) has no predictive "
                         "distribution over classes to take the Fisher of")
    model = TaskModel.with_head(backbone, head)
    prefix = "backbone_network."
    trainable = {prefix + name: p.detach() for name, p in backbone.network.named_parameters() if p.requires_grad}

    def log_probs(params, *example):
        logits = torch.func.functional_call(model, params, tuple(t.unsqueeze(0) for t in example))
        return F.log_softmax(logits, dim=-1)[0]

    def class_gradient(params, label, *example):
        return torch.func.grad(lambda p: log_probs(p, *example)[label])(params)

    per_example_gradient = torch.func.vmap(class_gradient, in_dims=(None, None) + (0,) * len(features))
    sums = {name: torch.zeros_like(p) for name, p in trainable.items()}
    examples = features[0].shape[0]
    count = examples if normaliser is None else normaliser
    for start in range(0, examples, batch_size):
        batch = tuple(f[start:start + batch_size].to(backbone.device) for f in features)
        with torch.no_grad():
            probabilities = torch.func.vmap(lambda *x: log_probs(trainable, *x).exp())(*batch)  # (B, classes)
        contribution = {name: torch.zeros((batch[0].shape[0], *p.shape), device=p.device)
                        for name, p in trainable.items()}
        for label in range(probabilities.shape[1]):
            grads = per_example_gradient(trainable, label, *batch)
            weight = probabilities[:, label]
            for name, g in grads.items():
                contribution[name] += weight.reshape(-1, *([1] * (g.ndim - 1))) * g.detach().square()
        if clip_norm is not None:
            squared = sum(c.flatten(1).square().sum(1) for c in contribution.values())
            scale = clip_factors(squared, clip_norm)
            contribution = {n: c * scale.reshape(-1, *([1] * (c.ndim - 1))) for n, c in contribution.items()}
        for name, c in contribution.items():
            sums[name] += c.sum(0)
    sums = {name: total.cpu() for name, total in sums.items()}  # noise is drawn on the CPU generator
    if clip_norm is not None and noise_multiplier > 0:
        sums = {n: (s + _noise_like(s, noise_multiplier * clip_norm, noise)).clamp(min=0) for n, s in sums.items()}
    return {name.removeprefix(prefix): (total / count).cpu() for name, total in sums.items()}
