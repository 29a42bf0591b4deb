"""The two parts of the Poisson-subsampled Gaussian mechanism that every private query shares, a fine-tune's
gradients (training/) and a merge statistic (privacy/statistics.py) alike: the secret Poisson batch and the factor
that clips one example's whole contribution to norm C. The noise is drawn by the caller from its own keyed stream
(privacy/randomness.py); the accounting is privacy/accounting.py's."""

from __future__ import annotations

import torch


def poisson_batch(num_examples: int, sample_rate: float, sampler) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each example independently with probability q (size varies).
    `sampler` is a secret stream (privacy/randomness.py): amplification by subsampling needs the batch to be secret."""
    return torch.nonzero(sampler.uniform(num_examples).cpu() < sample_rate).flatten()


def clip_factors(squared_norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """c_i = 1 / max(1, ||g_i|| / C): the factor that clips example i's whole gradient to norm at most C."""
    return 1.0 / torch.clamp(squared_norms.clamp(min=0).sqrt() / clip_norm, min=1.0)
