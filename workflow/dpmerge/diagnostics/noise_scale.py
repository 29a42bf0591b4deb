"""The effective noise scale of a fine-tuning run, with DP's injected noise beside the optimizer's own.

"How does the optimizer implicitly bias the model merging loss landscape?" (Zhang et al., arXiv 2510.04686)
finds merging success a non-monotonic function of one effective noise scale that learning rate, batch size,
weight decay and augmentation all move. Only its abstract is in shared/reference, so its exact definition is not
reproduced; ours is for DP-AdamW, the optimizer every run here uses, with DP's noise in it, and is stated in full
so that a reader can disagree with a piece:

    T = eta * D(eta, lambda, K) * s^2 / sqrt(g^2 + s^2),     s^2 = s_sample^2 + s_dp^2

which is eta * D * s where noise dominates the gradient (every private run here), and splits additively into
T_dp = eta D s_dp^2 / sqrt(g^2 + s^2) and T_sampling = eta D s_sample^2 / sqrt(g^2 + s^2).

- s_dp = sigma * C / B: the per-coordinate standard deviation of the Gaussian noise in the gradient handed to the
  optimizer (Eq. 4: (sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B, with sigma the per-query noise multiplier
  in the run's record: DP-SAM's sqrt(2) x larger sigma is in it; 0 without privacy).
- s_sample^2 = (1 - q) m / B: minibatch sampling noise under Poisson sampling at rate q = B / N, the variance of
  sum_{i in batch} g_i / B per coordinate; m is the per-coordinate second moment of per-example gradients
  (clipped at C for private runs, as in training), averaged over the trained coordinates. Poisson batches vary
  in size, so the second moment, not the variance, enters (the two agree where the mean gradient vanishes).
  Measured at the released model on the task's fixed test subsample (the examples every diagnostic reads, never
  training data), so it is no statistic of a private training set; for private runs it is also bounded without
  data: m <= C^2 / d.
- g^2: the squared mean gradient per coordinate (the signal), from the same probe.
- Why this form: Adam divides each coordinate by its gradient's root mean square sqrt(g^2 + s^2), so a step
  is eta (g + xi) / sqrt(g^2 + s^2) with xi the noise: SGD with learning rate eta / sqrt(g^2 + s^2) and noise of
  variance s^2. On a quadratic of curvature h its iterates spread with variance T / h, Langevin dynamics at
  temperature T = eta s^2 / (2 sqrt(g^2 + s^2)) (the 2 dropped). Where noise dominates this is eta s: Adam's
  noise enters through its standard deviation, hence the square-root batch-size scaling rule of Malladi et al.
  (NeurIPS 2022), where SGD's eta s^2 gives Smith & Le's eta / B. T is in units of the loss.
- D = mean over steps k < K of (1 - eta * lambda)^-k: AdamW's decoupled decay shrinks the weights by
  (1 - eta * lambda) per step, and the angular step of a scale-invariant weight (one before a normalization)
  grows as the weight shrinks; D is that growth averaged over the run (1 without decay).

The lr moves T linearly, B through both sigma (the accountant's calibration) and 1 / B, the budget through
sigma, the decay through D. The sampling and signal terms depend on the data (the test subsample); the other
pieces come from the run's record (what ran, not the configuration). Averaging s^2 and g^2 over coordinates before
the ratio is our simplification of Adam's per-coordinate normalization.
"""

from __future__ import annotations

import math

import torch

from dpmerge.models import losses


def dp_noise_std(noise_multiplier: float, clip_norm: float | None, batch_size: float) -> float:
    """s_dp = sigma C / B: per-coordinate std of DP's noise in the averaged gradient (0 without privacy)."""
    if not noise_multiplier:
        return 0.0
    return float(noise_multiplier) * float(clip_norm) / float(batch_size)


def decay_factor(lr: float, weight_decay: float, steps: int) -> float:
    """D = (1/K) sum_{k<K} (1 - lr * weight_decay)^-k: the mean growth of a scale-invariant weight's angular step
    as AdamW's decoupled decay shrinks it (1 without decay or steps)."""
    shrink = 1.0 - float(lr) * float(weight_decay)
    if not 0.0 < shrink <= 1.0:
        raise ValueError(f"lr * weight_decay = {lr * weight_decay:g}: AdamW's decay factor 1 - lr * wd must lie in "
                         "(0, 1]")
    if steps <= 0 or shrink == 1.0:
        return 1.0
    # geometric sum of r^k, r = 1 / shrink, k = 0..K-1
    ratio = 1.0 / shrink
    return (ratio**steps - 1.0) / (ratio - 1.0) / steps


def sampling_noise(second_moment: float, batch_size: float, sample_rate: float) -> float:
    """s_sample = sqrt((1 - q) m / B): per-coordinate std of sum_{i in batch} g_i / B under Poisson sampling."""
    if not 0.0 < float(sample_rate) <= 1.0:
        raise ValueError(f"sample rate must lie in (0, 1], got {sample_rate}")
    return math.sqrt((1.0 - float(sample_rate)) * float(second_moment) / float(batch_size))


def sampling_noise_bound(clip_norm: float, batch_size: float, sample_rate: float, dimension: int) -> float:
    """Upper bound on s_sample for clipped gradients without looking at data: ||clip_C(g)||^2 <= C^2, so m <= C^2/d."""
    return sampling_noise(float(clip_norm) ** 2 / float(dimension), batch_size, sample_rate)


def per_example_gradient_moments(model: torch.nn.Module, params: list[torch.Tensor], features, labels,
                                 clip_norm: float | None = None) -> tuple[float, float]:
    """(m, v): the per-coordinate second moment and (unbiased) variance of the per-example loss gradients over
    `params`, each averaged over coordinates. Each example's gradient is clipped to `clip_norm` first when given,
    as DP training clips it. Streams the first and second moments: memory stays at three copies of the parameters."""
    count = int(labels.shape[0])
    if count < 2:
        raise ValueError(f"the gradient moments need at least 2 examples, got {count}")
    first = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    second = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for i in range(count):
        example = tuple(f[i:i + 1] for f in features)
        loss = losses.task_loss(model(*example), labels[i:i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.detach() for g, p in zip(grads, params)]
        if clip_norm is not None:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            scale = min(1.0, float(clip_norm) / norm) if norm > 0 else 1.0
            grads = [g * scale for g in grads]
        for m1, m2, g in zip(first, second, grads):
            g = g.double()
            m1.add_(g)
            m2.add_(g * g)
    dimension = sum(p.numel() for p in params)
    raw = sum(float(m2.sum()) for m2 in second)
    centred = sum(float((m2 - m1 * m1 / count).sum()) for m1, m2 in zip(first, second))
    return raw / count / dimension, max(centred, 0.0) / (count - 1) / dimension


def mean_gradient_square(second_moment: float, variance: float, count: int) -> float:
    """g^2 per coordinate from per_example_gradient_moments over `count` examples: m - v (n - 1) / n, at least 0."""
    return max(float(second_moment) - float(variance) * (count - 1) / count, 0.0)


def effective_noise(*, lr: float, weight_decay: float, steps: int, batch_size: float, sample_rate: float,
                    noise_multiplier: float, clip_norm: float | None, second_moment: float,
                    mean_square: float = 0.0) -> dict:
    """Every piece of T for one run (names as in the module's docstring); `mean_square` is g^2."""
    s_dp = dp_noise_std(noise_multiplier, clip_norm, batch_size)
    s_sample = sampling_noise(second_moment, batch_size, sample_rate)
    decay = decay_factor(lr, weight_decay, steps)
    variance = s_sample**2 + s_dp**2
    rms = math.sqrt(float(mean_square) + variance)  # what Adam divides by
    scale = float(lr) * decay / rms if rms > 0 else 0.0
    return {"s_dp": s_dp, "s_sample": s_sample, "noise_std": math.sqrt(variance),
            "signal": math.sqrt(float(mean_square)), "decay_factor": decay, "effective_lr": float(lr) * decay,
            "noise_scale": scale * variance, "noise_scale_dp": scale * s_dp**2,
            "noise_scale_sampling": scale * s_sample**2,
            # how far Adam's normalizer is noise (1: the noise-dominated regime, where T = lr D s)
            "noise_share_of_rms": math.sqrt(variance) / rms if rms > 0 else 0.0,
            # what fraction of the gradient noise's variance DP injected
            "dp_variance_share": s_dp**2 / variance if variance > 0 else 0.0}
