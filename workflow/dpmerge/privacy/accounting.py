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
used here; we drive the accountants directly with the effective noise multiplier: RDP through `rdp.py`
(Opacus's analysis on arrays, held to Opacus's own functions by tests/test_rdp.py: 5-8x faster, which is most
of a short job's calibration time), PRV through Opacus's accountant.

Neighbouring relation (`NEIGHBOURING`). `add_remove` (default, as Opacus and TF Privacy account): two datasets
are neighbours if one is the other plus one example; the dataset size N is treated as public (it sets q = B/N,
delta = 1/N and the normaliser B, and records carry it). `replace_one`: one example replaced by another; a query's
sensitivity is then 2C, which the accountant sees as the add/remove mechanism at sigma/2 (paper, App. C.1), so
sigma_replace = 2 sigma_add_remove for the same epsilon. That is conservative: Google's dp_accounting PLD, which
accounts Poisson sampling under replacement exactly, gives a smaller epsilon at the same sigma (tested).

What is spent is computed from what ran (`spent_epsilon_of_steps`): the training loop counts the queries each
step made, and every distinct count k contributes its steps at sigma/sqrt(k).
"""

from __future__ import annotations

import math

from . import rdp

ACCOUNTANTS = ("rdp", "prv")
NEIGHBOURING = ("add_remove", "replace_one")

# Opacus's default Renyi orders stop at 63; with few steps or small q the optimum lies beyond, and the bound is
# then needlessly loose. A wider grid only tightens it (every order gives a valid bound).
RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 192, 256, 384, 512, 1024]


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; known accountants: {', '.join(ACCOUNTANTS)}")


def _check_neighbouring(neighbouring: str) -> None:
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}; known: {', '.join(NEIGHBOURING)}")


def sensitivity_in_clip_norms(neighbouring: str = "add_remove") -> int:
    """L2 sensitivity of one clipped-sum query, in units of the clipping norm C."""
    _check_neighbouring(neighbouring)
    return 2 if neighbouring == "replace_one" else 1


def effective_noise_multiplier(noise_multiplier: float, queries_per_step: int,
                               neighbouring: str = "add_remove") -> float:
    """Noise multiplier of the single add/remove mechanism equivalent to `queries_per_step` queries on one batch
    (divided by the sensitivity in clip norms: 2 under replace_one)."""
    if queries_per_step < 1:
        raise ValueError(f"queries_per_step must be >= 1, got {queries_per_step}")
    return noise_multiplier / math.sqrt(queries_per_step) / sensitivity_in_clip_norms(neighbouring)


def spent_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    queries_per_step: int = 1,
    accountant: str = "rdp",
    neighbouring: str = "add_remove",
) -> float:
    """epsilon spent after `steps` Poisson-subsampled steps.

    Args:
        noise_multiplier: sigma of each gradient query (noise std = sigma * C).
        sample_rate: Poisson sampling probability q of each example per step.
        steps: number of steps actually taken (each step counts once, whatever its batch size).
        delta: target delta (we use 1/N per task).
        queries_per_step: gradient queries per step on the same batch (2 for DP-SAM).
        accountant: "rdp" (Renyi DP, Mironov 2017) or "prv" (privacy random variables, Gopi et al. 2021).
        neighbouring: "add_remove" or "replace_one" (see the module docstring).
    """
    return spent_epsilon_of_steps(noise_multiplier, sample_rate, {queries_per_step: steps}, delta, accountant,
                                  neighbouring)


def spent_epsilon_of_steps(
    noise_multiplier: float,
    sample_rate: float,
    steps_by_queries: dict[int, int],
    delta: float,
    accountant: str = "rdp",
    neighbouring: str = "add_remove",
) -> float:
    """epsilon spent by the steps that ran: `steps_by_queries` maps k (queries made on one Poisson batch) to how
    many steps made k queries; each such step is one subsampled Gaussian at sigma/sqrt(k)."""
    return composed_epsilon(step_mechanisms(noise_multiplier, sample_rate, steps_by_queries, neighbouring), delta,
                            accountant)


def step_mechanisms(noise_multiplier: float, sample_rate: float, steps_by_queries: dict,
                    neighbouring: str = "add_remove") -> list[tuple[float, float, int]]:
    """The accountant's view of steps that ran: (effective noise multiplier, sample rate, steps) per count k of
    queries on one batch (keys may be JSON strings)."""
    return [(effective_noise_multiplier(noise_multiplier, int(k), neighbouring), sample_rate, int(steps))
            for k, steps in steps_by_queries.items() if int(k) > 0 and int(steps) > 0]


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    queries_per_step: int = 1,
    accountant: str = "rdp",
    neighbouring: str = "add_remove",
) -> float:
    """Smallest per-query sigma (to Opacus's search tolerance) whose spent epsilon stays <= target_epsilon."""
    _check_accountant(accountant)
    _check_neighbouring(neighbouring)
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be > 0, got {target_epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate}")
    if accountant == "rdp":
        sigma_one_query = rdp.noise_multiplier_for(target_epsilon, delta, sample_rate, steps, RDP_ORDERS)
    else:
        from opacus.accountants.utils import get_noise_multiplier  # 2 s of imports: only when PRV is asked for

        sigma_one_query = get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                               sample_rate=sample_rate, steps=steps, accountant=accountant)
    sigma = sigma_one_query * math.sqrt(queries_per_step) * sensitivity_in_clip_norms(neighbouring)
    # The binary search lands at or under target; re-check the exact value we will use.
    spent = spent_epsilon(sigma, sample_rate, steps, delta, queries_per_step, accountant, neighbouring)
    if spent > target_epsilon:
        raise RuntimeError(f"calibration failed: sigma={sigma:.4f} spends epsilon={spent:.4f} > {target_epsilon}")
    return float(sigma)


def composed_epsilon(mechanisms: list[tuple[float, float, int]], delta: float, accountant: str = "rdp") -> float:
    """epsilon of running every mechanism (noise multiplier, sample rate, steps) on the same dataset, composed by
    the accountant (e.g. a task's fine-tuning followed by a privatized merge statistic: one Poisson-subsampled
    step). Noise multipliers are the effective ones (see effective_noise_multiplier); composition of independent
    mechanisms, which holds because every mechanism draws its own keyed randomness (privacy/study_key.py)."""
    _check_accountant(accountant)
    mechanisms = [m for m in mechanisms if m[2] > 0]
    if not mechanisms:
        return 0.0
    if accountant == "rdp":
        return rdp.epsilon([tuple(m) for m in mechanisms], delta, RDP_ORDERS)
    from opacus.accountants import create_accountant

    ledger = create_accountant(accountant)
    ledger.history = [tuple(m) for m in mechanisms]
    return float(ledger.get_epsilon(delta=delta))


def record_mechanisms(record: dict) -> list[tuple[float, float, int]]:
    """The accountant's view of one release from its privacy record alone: (effective noise multiplier, sample
    rate, steps) for every count of queries per step that ran (the record's `steps_by_queries`)."""
    return step_mechanisms(float(record["noise_multiplier"]), float(record["sample_rate"]), record["steps_by_queries"],
                           record["neighbouring"])


def record_epsilon(record: dict, accountant: str | None = None) -> float:
    """epsilon recomputed from a privacy record (sigma, q, steps by queries, delta, relation), independently of
    the epsilon the record claims."""
    return composed_epsilon(record_mechanisms(record), float(record["delta"]), accountant or record["accountant"])
