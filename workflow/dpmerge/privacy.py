"""Noise calibration and privacy accounting for DP fine-tuning.

Every released task vector comes from T Poisson-subsampled steps at sampling rate q. At each step the method
makes `queries_per_step` clipped Gaussian gradient queries on the *same* batch, each with clipping norm C and
noise N(0, sigma^2 C^2 I):

- naive DP-SGD/DP-AdamW: 1 query per step.
- DP-SAM / DP-Merging: 2 queries per step (g at w, h at w + eps). Viewed as one concatenated release, the pair
  has L2 sensitivity sqrt(2)*C and per-coordinate noise sigma*C, i.e. a single subsampled Gaussian mechanism
  with noise multiplier sigma/sqrt(2) (paper, Thm. 5.1 / App. C.1). So sigma_SAM = sqrt(2) * sigma_SGD for the
  same (epsilon, delta, q, T).

We therefore account a step of k queries at noise multiplier sigma as ONE step of the subsampled Gaussian at
sigma/sqrt(k). Opacus's accountant hooks on the optimizer count one query per optimizer step and are never
used here; we drive its accountants directly with the effective noise multiplier.
"""

from __future__ import annotations

import math

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

ACCOUNTANTS = ("rdp", "prv")

# Opacus's default Renyi orders stop at 63; with few steps or small q the optimum lies beyond, and the bound is
# then needlessly loose. A wider grid only tightens it (every order gives a valid bound).
RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 192, 256, 384, 512, 1024]


def _epsilon_options(accountant: str) -> dict:
    return {"alphas": RDP_ORDERS} if accountant == "rdp" else {}


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; known accountants: {', '.join(ACCOUNTANTS)}")


def effective_noise_multiplier(noise_multiplier: float, queries_per_step: int) -> float:
    """Noise multiplier of the single mechanism equivalent to `queries_per_step` queries on one batch."""
    if queries_per_step < 1:
        raise ValueError(f"queries_per_step must be >= 1, got {queries_per_step}")
    return noise_multiplier / math.sqrt(queries_per_step)


def spent_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    queries_per_step: int = 1,
    accountant: str = "rdp",
) -> float:
    """epsilon spent after `steps` Poisson-subsampled steps.

    Args:
        noise_multiplier: sigma of each gradient query (noise std = sigma * C).
        sample_rate: Poisson sampling probability q of each example per step.
        steps: number of steps actually taken (each step counts once, whatever its batch size).
        delta: target delta (we use 1/N per task).
        queries_per_step: gradient queries per step on the same batch (2 for DP-SAM).
        accountant: "rdp" (Renyi DP, Mironov 2017) or "prv" (privacy random variables, Gopi et al. 2021).
    """
    _check_accountant(accountant)
    if steps == 0:
        return 0.0
    ledger = create_accountant(accountant)
    ledger.history = [(effective_noise_multiplier(noise_multiplier, queries_per_step), sample_rate, steps)]
    return float(ledger.get_epsilon(delta=delta, **_epsilon_options(accountant)))


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    queries_per_step: int = 1,
    accountant: str = "rdp",
) -> float:
    """Smallest per-query sigma (to Opacus's search tolerance) whose spent epsilon stays <= target_epsilon."""
    _check_accountant(accountant)
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be > 0, got {target_epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate}")
    sigma_one_query = get_noise_multiplier(
        target_epsilon=target_epsilon,
        target_delta=delta,
        sample_rate=sample_rate,
        steps=steps,
        accountant=accountant,
        **_epsilon_options(accountant),
    )
    sigma = sigma_one_query * math.sqrt(queries_per_step)
    # The binary search lands at or under target; re-check the exact value we will use.
    spent = spent_epsilon(sigma, sample_rate, steps, delta, queries_per_step, accountant)
    if spent > target_epsilon:
        raise RuntimeError(f"calibration failed: sigma={sigma:.4f} spends epsilon={spent:.4f} > {target_epsilon}")
    return float(sigma)


def composed_epsilon(mechanisms: list[tuple[float, float, int]], delta: float, accountant: str = "rdp") -> float:
    """epsilon of running every mechanism (noise multiplier, sample rate, steps) on the same dataset, composed by
    the accountant (e.g. a task's fine-tuning followed by a privatized merge statistic at sample rate 1, 1 step).
    Noise multipliers are the effective ones (see effective_noise_multiplier)."""
    _check_accountant(accountant)
    mechanisms = [m for m in mechanisms if m[2] > 0]
    if not mechanisms:
        return 0.0
    ledger = create_accountant(accountant)
    ledger.history = [tuple(m) for m in mechanisms]
    return float(ledger.get_epsilon(delta=delta, **_epsilon_options(accountant)))
