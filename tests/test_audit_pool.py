"""Pooled audits and exposure by group (privacy/audit.py, stages/audit.py `audit_pooled`, the audit ledger): a
release group's runs pooled into one valid bound with more power than one run, the membership AUC and its
interval against brute force and by coverage, and pooled rows the ledger recomputes and refuses."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from audit_toys import prepared_task, randomized_response_scores
from dpmerge.privacy.audit import audit_scores, exposure_difference, membership_auc


def test_the_membership_auc_is_the_share_of_pairs_an_included_canary_wins():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, 60).astype(float)  # many ties: each counts 1/2
    coins = rng.random(60) < 0.5
    brute = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a in scores[coins] for b in scores[~coins]])
    auc, variance = membership_auc(scores, coins)
    assert auc == pytest.approx(brute, abs=1e-12) and variance > 0
    assert math.isnan(membership_auc(scores, np.ones(60, dtype=bool))[0])


@pytest.mark.slow
def test_the_auc_interval_covers_the_truth_about_95_percent_of_the_time():
    from scipy.stats import norm

    rng = np.random.default_rng(2)
    truth = norm.cdf(0.5 / math.sqrt(2))  # P[N(0.5, 1) > N(0, 1)]
    covered = []
    for _ in range(400):
        coins = rng.random(200) < 0.5
        result = audit_scores(0.5 * coins + rng.standard_normal(200), coins, 1e-5)
        covered.append(result["auc_low"] <= truth <= result["auc_high"])
    assert 0.92 <= np.mean(covered) <= 0.98


def test_an_exposure_difference_is_centred_and_its_interval_sees_a_real_one():
    rng = np.random.default_rng(3)
    results = {}
    for name, signal in (("exposed", 1.0), ("same", 0.3), ("rest", 0.3)):
        coins = rng.random(400) < 0.5
        results[name] = audit_scores(signal * coins + rng.standard_normal(400), coins, 1e-5)
    difference, low, high = exposure_difference(results["exposed"], results["rest"])
    assert difference == pytest.approx(results["exposed"]["auc"] - results["rest"]["auc"]) and low > 0
    _, low, high = exposure_difference(results["same"], results["rest"])
    assert low < 0 < high


@pytest.mark.slow
def test_pooled_runs_are_a_valid_audit_with_the_power_of_all_their_canaries():
    """Four independent exactly 2-DP runs pooled: above the truth in at most 8 % of trials. Four weak runs
    (signal 0.3 in unit noise, 1,000 canaries each): the pool's bound is well above one run's."""
    rng = np.random.default_rng(4)
    pooled = []
    for _ in range(200):
        runs = [randomized_response_scores(rng, 250, 2.0) for _ in range(4)]
        pooled.append(audit_scores(np.concatenate([s for s, _ in runs]), np.concatenate([c for _, c in runs]),
                                   0.0)["epsilon_lb"])
    assert np.mean(np.array(pooled) > 2.0) <= 0.08
    single, pool = [], []
    for _ in range(15):
        runs = []
        for _ in range(4):
            coins = rng.random(1000) < 0.5
            runs.append((0.3 * coins + rng.standard_normal(1000), coins))
        single.append(audit_scores(*runs[0], 1e-5)["epsilon_lb"])
        pool.append(audit_scores(np.concatenate([s for s, _ in runs]), np.concatenate([c for _, c in runs]),
                                 1e-5)["epsilon_lb"])
    assert np.median(pool) > 1.5 * np.median(single)


HPARAMS = {"epochs": 4, "batch_size": 100, "lr": 0.03, "clip_norm": 1.0}


@pytest.fixture
def kept_runs(tmp_path, wide, study_key):  # noqa: F811 (fixtures)
    """Kept white-box runs of naive DP at epsilon 2 on two tasks, seed 0, and one of the first task at seed 1."""
    from dpmerge.stages.audit import audit

    runs = {}
    for task, seed, index in (("alpha", 0, 0), ("beta", 0, 1), ("alpha", 1, 0)):
        name = f"{task}.s{seed}"
        audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"},
              data=prepared_task(tmp_path, task, wide[0], index), method="naive_dp", hparams=HPARAMS, epsilon=2.0,
              seed=seed, study_key=str(study_key), out=str(tmp_path / f"{name}.parquet"), canaries=500,
              keep_run=str(tmp_path / f"{name}.pt"))
        runs[name] = (str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.parquet"))
    return runs


@pytest.mark.slow
def test_a_pooled_audit_holds_every_run_and_the_ledger_recomputes_its_claim(tmp_path, kept_runs):
    from dpmerge.privacy.audit_ledger import build_audit_ledger, check_audits
    from dpmerge.stages.audit import audit_merged, audit_pooled

    spec = {"kind": "efficientnet_lite0"}
    audit_merged(runs=[kept_runs["alpha.s0"][0], kept_runs["beta.s0"][0]], operator="task_arithmetic",
                 params={"scaling": 0.5}, backbone_spec=spec, out=str(tmp_path / "merged.parquet"),
                 keep_scores=str(tmp_path / "merged.pt"))
    runs = [path for path, _ in kept_runs.values()]
    rows = audit_pooled(runs=runs, merged=[str(tmp_path / "merged.pt")], out=str(tmp_path / "pooled.parquet"))
    assert [(r["model"], r["canaries"]) for r in rows] == [("individual", 1500), ("merged", 1000)]
    assert json.loads(rows[0]["pooled_runs"]) == ["alpha/s0", "alpha/s1", "beta/s0"]
    # the scores are the runs' own: pooling them again by hand gives the same bound
    kept = [torch.load(path, weights_only=True) for path in runs]
    by_hand = audit_scores(torch.cat([k["scores"] for k in kept]).numpy(),
                           torch.cat([k["included"] for k in kept]).numpy(), 1e-5)
    assert rows[0]["epsilon_lb"] == by_hand["epsilon_lb"] and rows[0]["correct"] == by_hand["correct"]

    files = [rows for _, rows in kept_runs.values()] + [str(tmp_path / "merged.parquet"),
                                                         str(tmp_path / "pooled.parquet")]
    audits = build_audit_ledger(files)
    assert check_audits(audits) == []
    pooled = audits[audits["pooled_runs"].notna()]
    singles = audits[audits["pooled_runs"].isna() & (audits["model"] == "individual")]
    assert (pooled["recomputed_claim"] == singles["recomputed_claim"].max()).all()
    # without one of its runs the pool's claim cannot be recomputed; an edited claim is caught
    problems = check_audits(build_audit_ledger(files[1:]))
    assert any("not in the ledger once each" in p and "alpha/s0" in p for p in problems)
    edited = pd.read_parquet(tmp_path / "pooled.parquet")
    edited["claimed_epsilon_at_audit_delta"] = 99.0
    edited.to_parquet(tmp_path / "edited.parquet")
    assert any("its record gives" in p for p in check_audits(build_audit_ledger(files[:-1] + [
        str(tmp_path / "edited.parquet")])))


@pytest.mark.slow
def test_a_pool_of_runs_that_do_not_belong_together_is_refused(tmp_path, kept_runs, wide, study_key):  # noqa: F811
    from dpmerge.stages.audit import audit, audit_pooled

    first = kept_runs["alpha.s0"][0]
    with pytest.raises(ValueError, match="a run is given twice"):
        audit_pooled(runs=[first, first], out=str(tmp_path / "twice.parquet"))
    audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"}, data=str(tmp_path / "beta.pt"),
          method="naive_dp", hparams=HPARAMS, epsilon=4.0, seed=0, study_key=str(study_key),
          out=str(tmp_path / "other.parquet"), canaries=500, keep_run=str(tmp_path / "other.pt"))
    with pytest.raises(ValueError, match="differ in target_epsilon"):
        audit_pooled(runs=[first, str(tmp_path / "other.pt")], out=str(tmp_path / "mixed.parquet"))
    with pytest.raises(ValueError, match="is not a kept audit run"):
        audit_pooled(runs=[str(tmp_path / "other.parquet")], out=str(tmp_path / "bad.parquet"))
    for name in ("alpha.s0", "beta.s0"):  # stated at delta 1e-4: alone each keeps power, 1,000 pooled have none
        run = torch.load(kept_runs[name][0], weights_only=True)
        run["row"]["audit_delta"] = 1e-4
        torch.save(run, tmp_path / f"{name}.big.pt")
    with pytest.raises(ValueError, match="2 m delta term .* must stay below 0.1"):
        audit_pooled(runs=[str(tmp_path / "alpha.s0.big.pt"), str(tmp_path / "beta.s0.big.pt")],
                     out=str(tmp_path / "big.parquet"))
