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
used here; we drive the accountants directly with the effective noise multiplier: the PLD through dp_accounting
(`pld.py`, the default), RDP through `rdp.py` (Opacus's analysis on arrays, held to Opacus's own functions by
tests/test_rdp.py), PRV through Opacus's accountant. Under replacement the pair of queries is still one
mechanism: the two clipped gradients of the example, and of its replacement, each have norm <= sqrt(2) C together.

Neighbouring relation (`NEIGHBOURING`). `replace_one` (default): two datasets of the same size N are neighbours if
one example is replaced by another. N is then public, and records carry it (it sets q = B/N, delta = 1/N and the
normaliser B). A query's clipped sum moves by up to 2C, but under Poisson sampling the pair is not the add/remove
mechanism at sigma/2: it is accounted exactly by dp_accounting's PLD (`pld`, privacy/pld.py), which charges less
than doubling sigma would and more than add/remove at the same sigma (a paper-like run calibrated for add/remove
at epsilon 1 spends 1.30 under replacement). `add_remove`: one example added or removed. Then N itself differs
between neighbours, so nothing released may depend on it: q and the step count come from a public size the
config declares (`privacy.public_n`), delta defaults to 1/public_n, and the record carries that bound, never N.
The RDP and PRV accountants (Opacus's analyses) account add/remove only.

What is spent is computed from what ran (`spent_epsilon_of_steps`): the training loop counts the queries each
step made, and every distinct count k contributes its steps at sigma/sqrt(k).
"""

from __future__ import annotations

import math

from . import pld, rdp

ACCOUNTANTS = ("pld", "rdp", "prv")
NEIGHBOURING = pld.RELATIONS  # ("replace_one", "add_remove")
# Opacus's RDP and PRV analyses are of add/remove; replacement under Poisson sampling is accounted by the PLD.
REPLACE_ONE_ACCOUNTANTS = ("pld",)

# Opacus's default Renyi orders stop at 63; with few steps or small q the optimum lies beyond, and the bound is
# then needlessly loose. A wider grid only tightens it (every order gives a valid bound).
RDP_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 192, 256, 384, 512, 1024]


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; known accountants: {', '.join(ACCOUNTANTS)}")


def _check_neighbouring(neighbouring: str) -> None:
    if neighbouring not in NEIGHBOURING:
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}; known: {', '.join(NEIGHBOURING)}")


def check_relation(accountant: str, neighbouring: str) -> None:
    _check_accountant(accountant)
    _check_neighbouring(neighbouring)
    if neighbouring == "replace_one" and accountant not in REPLACE_ONE_ACCOUNTANTS:
        raise ValueError(f"accountant {accountant!r} accounts add/remove only; under replace_one use "
                         f"{' or '.join(REPLACE_ONE_ACCOUNTANTS)} (finetune.accountant)")


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
    accountant: str = "pld",
    neighbouring: str = "replace_one",
) -> float:
    """epsilon spent after `steps` Poisson-subsampled steps.

    Args:
        noise_multiplier: sigma of each gradient query (noise std = sigma * C).
        sample_rate: Poisson sampling probability q of each example per step.
        steps: number of steps actually taken (each step counts once, whatever its batch size).
        delta: target delta (we use 1/N per task).
        queries_per_step: gradient queries per step on the same batch (2 for DP-SAM).
        accountant: "pld" (privacy loss distributions, dp_accounting), "rdp" (Renyi DP, Mironov 2017) or "prv"
            (privacy random variables, Gopi et al. 2021); the last two account add/remove only.
        neighbouring: "replace_one" or "add_remove" (see the module docstring).
    """
    return spent_epsilon_of_steps(noise_multiplier, sample_rate, {queries_per_step: steps}, delta, accountant,
                                  neighbouring)


def spent_epsilon_of_steps(
    noise_multiplier: float,
    sample_rate: float,
    steps_by_queries: dict[int, int],
    delta: float,
    accountant: str = "pld",
    neighbouring: str = "replace_one",
) -> float:
    """epsilon spent by the steps that ran: `steps_by_queries` maps k (queries made on one Poisson batch) to how
    many steps made k queries; each such step is one subsampled Gaussian at sigma/sqrt(k)."""
    return composed_epsilon(step_mechanisms(noise_multiplier, sample_rate, steps_by_queries), delta, accountant,
                            neighbouring)


def step_mechanisms(noise_multiplier: float, sample_rate: float,
                    steps_by_queries: dict) -> list[tuple[float, float, int]]:
    """The accountant's view of steps that ran: (effective noise multiplier, sample rate, steps) per count k of
    queries on one batch (keys may be JSON strings)."""
    return [(effective_noise_multiplier(noise_multiplier, int(k)), sample_rate, int(steps))
            for k, steps in steps_by_queries.items() if int(k) > 0 and int(steps) > 0]


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    queries_per_step: int = 1,
    accountant: str = "pld",
    neighbouring: str = "replace_one",
) -> float:
    """Smallest per-query sigma (to Opacus's search tolerance) whose spent epsilon stays <= target_epsilon."""
    check_relation(accountant, neighbouring)
    if not target_epsilon > 0:
        raise ValueError(f"target epsilon must be > 0, got {target_epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must be in (0, 1], got {sample_rate}")
    if accountant == "pld":
        sigma_one_query = pld.cached_noise_multiplier_for(target_epsilon, delta, sample_rate, steps, neighbouring)
    elif accountant == "rdp":
        sigma_one_query = rdp.noise_multiplier_for(target_epsilon, delta, sample_rate, steps, RDP_ORDERS)
    else:
        from opacus.accountants.utils import get_noise_multiplier  # 2 s of imports: only when PRV is asked for

        sigma_one_query = get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                               sample_rate=sample_rate, steps=steps, accountant=accountant)
    sigma = sigma_one_query * math.sqrt(queries_per_step)
    # The binary search lands at or under target; re-check the exact value we will use.
    spent = spent_epsilon(sigma, sample_rate, steps, delta, queries_per_step, accountant, neighbouring)
    if spent > target_epsilon:
        raise RuntimeError(f"calibration failed: sigma={sigma:.4f} spends epsilon={spent:.4f} > {target_epsilon}")
    return float(sigma)


def composed_epsilon(mechanisms: list[tuple[float, float, int]], delta: float, accountant: str = "pld",
                     neighbouring: str = "replace_one") -> float:
    """epsilon of running every mechanism (noise multiplier, sample rate, steps) on the same dataset, composed by
    the accountant (e.g. a task's fine-tuning followed by a privatized merge statistic: one Poisson-subsampled
    step). Noise multipliers are the effective ones (see effective_noise_multiplier); composition of independent
    mechanisms, which holds because every mechanism draws its own keyed randomness (privacy/study_key.py)."""
    check_relation(accountant, neighbouring)
    mechanisms = [m for m in mechanisms if m[2] > 0]
    if not mechanisms:
        return 0.0
    if accountant == "pld":
        return pld.epsilon(mechanisms, delta, neighbouring)
    if accountant == "rdp":
        return rdp.epsilon([tuple(m) for m in mechanisms], delta, RDP_ORDERS)
    from opacus.accountants import create_accountant

    ledger = create_accountant(accountant)
    ledger.history = [tuple(m) for m in mechanisms]
    return float(ledger.get_epsilon(delta=delta))


def accounted_size(record) -> tuple[str, int | None]:
    """(name, value) of the dataset size a release's q, steps and delta came from: under add/remove the public
    size it declared (`public_n`; N differs between neighbours and is never released), else N."""
    if record.get("neighbouring") == "add_remove":
        return "public_n", record.get("public_n")
    return "N", record.get("num_train_examples")


def record_mechanisms(record: dict) -> list[tuple[float, float, int]]:
    """The accountant's view of one release from its privacy record alone: (effective noise multiplier, sample
    rate, steps) for every count of queries per step that ran (the record's `steps_by_queries`)."""
    return step_mechanisms(float(record["noise_multiplier"]), float(record["sample_rate"]), record["steps_by_queries"])


def record_epsilon(record: dict, accountant: str | None = None) -> float:
    """epsilon recomputed from a privacy record (sigma, q, steps by queries, delta, relation), independently of
    the epsilon the record claims."""
    return composed_epsilon(record_mechanisms(record), float(record["delta"]), accountant or record["accountant"],
                            record["neighbouring"])
