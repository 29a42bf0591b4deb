"""One-run privacy audits (privacy/audit.py, training/canaries.py, stages/audit.py): the bound against a
transcription of the paper's code, its validity and power on randomized response, and audits of real DP runs that
can fail: the non-private method leaks, a run without its noise fails its claim, and DP-SAM calibrated for one
query shows more leakage than DP-SAM calibrated for its two."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binom

from audit_toys import prepared_task, randomized_response_scores
from conftest import TEST_STUDY_KEY, install_test_key
from dpmerge.artifacts import load_tensors, read_metadata
from dpmerge.privacy.audit import audit_scores, epsilon_lower_bound, guess_counts, one_run_p_value


def reference_p_value(m, r, v, eps, delta):
    """Steinke, Nasr & Jagielski's p_value_DP_audit (arXiv 2305.08846, Algorithm 2), transcribed loop for loop:
    beta = P[Binomial(r, q) >= v], alpha the largest P[v > Binomial(r, q) >= v - i] / i, p = beta + alpha 2 m delta."""
    q = 1 / (1 + math.exp(-eps))
    beta = binom.sf(v - 1, r, q)
    alpha = 0
    total = 0
    for i in range(1, v + 1):
        total = total + binom.pmf(v - i, r, q)
        if total > i * alpha:
            alpha = total / i
    return min(beta + alpha * delta * 2 * m, 1)


@pytest.mark.parametrize("m,r,v", [(1000, 125, 97), (1000, 250, 238), (200, 50, 25), (64, 64, 64), (10, 3, 0)])
@pytest.mark.parametrize("eps", [0.0, 0.5, 2.0, 6.0])
@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3])
def test_the_p_value_is_the_papers(m, r, v, eps, delta):
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(reference_p_value(m, r, v, eps, delta), rel=1e-9,
                                                                 abs=1e-15)


def test_the_bound_is_the_largest_refuted_epsilon():
    bound = epsilon_lower_bound(1000, 250, 238, 1e-5, 0.05)
    assert 0 < bound < 10
    assert one_run_p_value(1000, 250, 238, bound - 1e-3, 1e-5) < 0.05 <= one_run_p_value(1000, 250, 238,
                                                                                          bound + 1e-3, 1e-5)
    assert epsilon_lower_bound(1000, 250, 125, 1e-5) == 0.0  # chance level refutes nothing
    assert epsilon_lower_bound(1000, 0, 0, 1e-5) == 0.0
    # the delta term costs power: the same guesses refute less at a larger delta
    assert epsilon_lower_bound(1000, 250, 238, 1e-4) < bound


@pytest.mark.slow
def test_the_bound_holds_on_an_exactly_private_mechanism_and_has_power():
    rng = np.random.default_rng(0)
    bounds = [audit_scores(*randomized_response_scores(rng, 500, 2.0), delta=0.0)["epsilon_lb"] for _ in range(200)]
    # valid: above the truth in at most 5 % of runs (plus slack for 200 draws); powerful: usually close below it
    assert np.mean(np.array(bounds) > 2.0) <= 0.08
    assert np.median(bounds) > 1.0


def test_guess_counts_are_fixed_by_the_number_of_canaries_alone():
    assert guess_counts(1000) == [(62, 63), (125, 0), (125, 125), (250, 0), (250, 250), (500, 0)]
    assert all(k_in + k_out <= 4 for k_in, k_out in guess_counts(4))


def test_scores_must_be_one_finite_value_per_canary():
    with pytest.raises(ValueError, match="one score per canary"):
        audit_scores([1.0, 2.0], [True], 1e-5)
    with pytest.raises(ValueError, match="finite"):
        audit_scores([1.0, float("nan")], [True, False], 1e-5)


# ------------------------------------------------------------------------------------- audits of real DP runs


def audited(wide, method, epsilon, canaries=2000, **settings):
    from dpmerge.training.canaries import WhiteBoxAudit
    from dpmerge.training.finetune import FinetuneConfig, train

    backbone, features, labels = wide
    config = FinetuneConfig(method=method, target_epsilon=epsilon, epochs=8, batch_size=100, lr=1e-2,
                            clip_norm=1.0, **settings)
    result = train(backbone, 2, features, labels, config, study_key=TEST_STUDY_KEY, log=lambda line: None,
                      identity={"backbone": "toy", "task": "toy", "method": method, "audit": canaries},
                      audit=WhiteBoxAudit(canaries))
    scores = result.canaries.scores(result.task_vector).numpy()
    return audit_scores(scores, result.canaries.included.numpy(), delta=1e-5), result


@pytest.mark.slow
def test_canaries_are_placed_on_distinct_task_vector_coordinates_and_half_are_included(wide):
    _, result = audited(wide, "naive_dp", 8.0)
    coordinates = result.canaries.coordinates
    assert coordinates.unique().numel() == 2000 and int(coordinates.max()) < 16 * 256 + 256
    assert abs(int(result.canaries.included.sum()) - 1000) < 100


@pytest.mark.slow
def test_without_noise_the_audit_sees_the_leakage(wide):
    nonprivate, _ = audited(wide, "nonprivate", None)
    private, _ = audited(wide, "naive_dp", 1.0)
    assert nonprivate["epsilon_lb"] > 2.0
    assert nonprivate["epsilon_lb"] > 3 * private["epsilon_lb"]


@pytest.mark.slow
def test_dp_sam_calibrated_for_one_query_leaks_more_than_dp_sam_calibrated_for_two(wide, monkeypatch):
    """The bug privacy rule 1 forbids: DP-SAM's two queries accounted as one, so sigma is that of DP-SGD."""
    import dpmerge.training.finetune as finetune_module

    correct, _ = audited(wide, "dp_sam", 8.0)
    calibrate, spent = finetune_module.calibrate_noise_multiplier, finetune_module.spent_epsilon_of_steps
    monkeypatch.setattr(finetune_module, "calibrate_noise_multiplier",
                        lambda eps, delta, q, steps, queries, *rest: calibrate(eps, delta, q, steps, 1, *rest))
    monkeypatch.setattr(finetune_module, "spent_epsilon_of_steps",
                        lambda sigma, q, ran, delta, *rest: spent(sigma, q, {1: sum(ran.values())}, delta, *rest))
    broken, result = audited(wide, "dp_sam", 8.0)
    assert result.record["steps_by_queries"] == {"2": 40}  # it still made two queries per step
    assert broken["epsilon_lb"] > correct["epsilon_lb"] + 0.2


@pytest.mark.slow
def test_the_audit_command_fails_a_run_whose_noise_never_reached_the_gradient(tmp_path, wide, study_key,
                                                                               monkeypatch):
    from dpmerge import cli
    from dpmerge.artifacts import save_prepared
    from dpmerge.privacy import randomness

    backbone, features, labels = wide
    save_prepared(tmp_path / "toy.pt", task="toy", backbone="toy", task_spec={"num_classes": 2, "metric": "accuracy"},
                  class_names=["a", "b"], train_features=features, train_labels=labels, test_features=features,
                  test_labels=labels, pretrained_sha256=backbone.checkpoint_sha256)
    key = study_key
    # a registered kind for the zero-shot-head lookup; the network itself is the wide top above
    args = ["audit", "--backbone", "toy", "--backbone-spec", '{"kind": "efficientnet_lite0"}',
            "--data", str(tmp_path / "toy.pt"), "--method", "naive_dp", "--epsilon", "0.5", "--study-key", str(key),
            "--canaries", "2000",
            "--audit-delta", "1e-5", "--hparams",
            '{"epochs": 8, "batch_size": 100, "lr": 0.01, "clip_norm": 1.0}']
    cli.main([*args, "-o", str(tmp_path / "honest.parquet")])
    honest = pd.read_parquet(tmp_path / "honest.parquet").iloc[0]
    assert honest["verdict"] == "PASS" and honest["epsilon_lb"] <= honest["claimed_epsilon_at_audit_delta"]
    assert honest["target_epsilon"] == 0.5 and honest["canaries"] == 2000

    class Silent:  # the noise stream of a broken implementation: sigma is recorded, no noise is drawn
        def normal_(self, tensors, std):
            for tensor in tensors:
                tensor.zero_()

    real_stream = randomness.MechanismRandomness.stream
    monkeypatch.setattr(randomness.MechanismRandomness, "stream", lambda self, name, device="cpu": (
        Silent() if name == "gaussian_noise" else real_stream(self, name, device)))
    cli.main([*args, "-o", str(tmp_path / "broken.parquet")])
    broken = pd.read_parquet(tmp_path / "broken.parquet").iloc[0]
    assert broken["verdict"] == "FAIL"
    # the claim is the run's add/remove epsilon at delta 1e-5 (below its replace-one 0.5 at 1/N: canaries are
    # inserted or left out), and the noiseless run's bound is above it
    assert broken["epsilon_lb"] > broken["claimed_epsilon_at_audit_delta"] > 0.3
    assert '"noise_multiplier"' in broken["privacy_record"]

    # The ledger: the broken run's bound refutes its record; the honest one's run composes with its task's
    # releases; a claim edited in a row is caught, since the check recomputes it from the run's record.
    from dpmerge.privacy.audit_ledger import build_audit_ledger, check_audits
    from dpmerge.privacy.ledger import task_composition
    from privacy_records import ledger, release

    audits = build_audit_ledger([str(tmp_path / "honest.parquet"), str(tmp_path / "broken.parquet")])
    problems = check_audits(audits)
    assert len(problems) == 1 and "broken.parquet" in problems[0] and "exceeds the epsilon" in problems[0]
    releases = ledger(release("toy", epsilon=0.5))
    alone = task_composition(releases).iloc[0]
    honest_run = audits[audits["path"].str.endswith("honest.parquet")]
    with_audits = task_composition(releases, audits=honest_run).iloc[0]
    assert with_audits["private_audit_runs"] == 1 and alone["private_audit_runs"] == 0
    assert with_audits["composed_epsilon"] > alone["composed_epsilon"] + 0.1
    edited = pd.read_parquet(tmp_path / "honest.parquet")
    edited["claimed_epsilon_at_audit_delta"] = 50.0
    edited.to_parquet(tmp_path / "edited.parquet")
    assert any("its record gives" in p for p in check_audits(build_audit_ledger([str(tmp_path / "edited.parquet")])))


def test_an_audit_without_power_is_refused_before_it_runs(tmp_path):
    from dpmerge.stages.audit import audit

    with pytest.raises(ValueError, match="2 m delta term"):
        audit(backbone="toy", backbone_spec={"kind": "toy"}, data=str(tmp_path / "none.pt"), method="naive_dp",
              hparams={}, epsilon=1.0, seed=0, study_key=str(tmp_path / "k"), out=str(tmp_path / "a.parquet"),
              canaries=1000, audit_delta=1e-3)


@pytest.mark.slow
def test_a_black_box_audit_sees_what_a_model_user_sees_and_more_without_noise(tmp_path, wide, study_key):
    from dpmerge.artifacts import save_prepared
    from dpmerge.stages.audit import audit

    backbone, features, labels = wide
    generator = torch.Generator().manual_seed(1)
    held_out = (torch.randn(400, 16, generator=generator),)
    save_prepared(tmp_path / "toy.pt", task="toy", backbone="toy", task_spec={"num_classes": 4, "metric": "accuracy"},
                  class_names=list("abcd"), train_features=features, train_labels=labels % 4,
                  test_features=held_out, test_labels=torch.randint(0, 4, (400,), generator=generator),
                  pretrained_sha256=backbone.checkpoint_sha256)
    key = study_key
    rows = {}
    for method, epsilon in (("nonprivate", None), ("naive_dp", 1.0)):
        rows[method] = audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"},
                             data=str(tmp_path / "toy.pt"),
                             method=method, hparams={"epochs": 30, "batch_size": 100, "lr": 0.03, "clip_norm": 1.0},
                             epsilon=epsilon, seed=0, study_key=str(key), out=str(tmp_path / f"{method}.parquet"),
                             canaries=400, kind="black_box")
    assert rows["nonprivate"]["audit"] == "black_box" and rows["nonprivate"]["canaries"] == 400
    # the run trained on the included canaries: N grew by their number
    import json
    record = json.loads(rows["naive_dp"]["privacy_record"])
    assert record["num_train_examples"] == 500 + rows["naive_dp"]["included"]
    assert rows["nonprivate"]["epsilon_lb"] > 1.0 > rows["naive_dp"]["epsilon_lb"]
    assert rows["naive_dp"]["verdict"] == "PASS"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["white_box", "black_box"])
def test_merged_models_are_audited_per_task_and_merging_leaks_no_more_than_the_claim(tmp_path, wide, study_key,
                                                                                     kind):
    from dpmerge import cli

    backbone = wide[0]
    key = study_key
    spec = '{"kind": "efficientnet_lite0"}'
    runs = []
    for index, task in enumerate(("alpha", "beta")):
        runs.append(str(tmp_path / f"{task}.run"))
        cli.main(["audit", "--backbone", "toy", "--backbone-spec", spec, "--data",
                  prepared_task(tmp_path, task, backbone, index), "--method", "nonprivate", "--study-key", str(key),
                  "--kind", kind, "--canaries", "400", "--hparams",
                  '{"epochs": 30, "batch_size": 100, "lr": 0.03, "clip_norm": 1.0}',
                  "--keep-run", runs[-1], "-o", str(tmp_path / f"{task}.parquet")])
    assert (Path(runs[0]).stat().st_mode & 0o777) == 0o600  # the coins are secret
    cli.main(["audit-merge", *runs, "--method", "task_arithmetic", "--param", "scaling=0.5", "--backbone-spec", spec,
              "--keep-scores", str(tmp_path / "merged.pt"), "-o", str(tmp_path / "merged.parquet")])
    assert (Path(tmp_path / "merged.pt").stat().st_mode & 0o777) == 0o600
    merged = pd.read_parquet(tmp_path / "merged.parquet")
    assert list(merged["task"]) == ["alpha", "beta"] and set(merged["operator"]) == {"task_arithmetic"}
    individual = [pd.read_parquet(tmp_path / f"{task}.parquet")["epsilon_lb"].iloc[0] for task in ("alpha", "beta")]
    assert list(merged["individual_epsilon_lb"]) == individual
    # without noise the merged model exposes less than each task's own model, and in parameter space still much:
    # a canary's coordinate keeps its sign under scaling, only the other task's vector blurs it
    assert (merged["epsilon_lb"] < merged["individual_epsilon_lb"]).all()
    if kind == "white_box":
        assert (merged["epsilon_lb"] > 0.5).all()
    # the release group's pooled audit: both tasks' canaries in one bound, on the task models and the merged one
    cli.main(["audit-pool", *runs, "--merged", str(tmp_path / "merged.pt"), "-o", str(tmp_path / "pooled.parquet")])
    pooled = pd.read_parquet(tmp_path / "pooled.parquet").set_index("model")
    assert list(pooled.index) == ["individual", "merged"] and (pooled["canaries"] == 800).all()
    assert pooled.loc["merged", "operator"] == "task_arithmetic" and set(pooled["task"]) == {"pooled"}
    assert pooled.loc["merged", "epsilon_lb"] < pooled.loc["individual", "epsilon_lb"]
    # the table and figure read individual, merged and pooled audits together; without the pool, two runs give
    # no cell (the larger of two 95 % bounds is not a 95 % bound)
    files = [str(tmp_path / f) for f in ("alpha.parquet", "beta.parquet", "merged.parquet")]
    for name, extra in (("unpooled", []), ("audit", [str(tmp_path / "pooled.parquet")])):
        cli.main(["audit-report", *files, *extra, "--out-prefix", str(tmp_path / name),
                  "--figure", str(tmp_path / f"{name}.png"), str(tmp_path / f"{name}.pdf")])
    assert pd.read_parquet(tmp_path / "unpooled.parquet")[f"{kind} individual epsilon_lb"].isna().all()
    summary = pd.read_parquet(tmp_path / "audit.parquet")
    assert len(summary) == 1 and summary["runs"].iloc[0] == 2 and summary["verdict"].iloc[0] == "PASS"
    assert summary[f"{kind} individual epsilon_lb"].iloc[0] == pooled.loc["individual", "epsilon_lb"]
    assert summary[f"{kind} merged epsilon_lb"].iloc[0] == pooled.loc["merged", "epsilon_lb"]
    assert summary[f"{kind} individual canaries"].iloc[0] == 800
    assert "| nonprivate |" in (tmp_path / "audit.md").read_text()
    assert (tmp_path / "audit.png").stat().st_size > 0 and (tmp_path / "audit.pdf").stat().st_size > 0
    with pytest.raises(SystemExit, match="one kept run per task"):
        cli.main(["audit-merge", runs[0], runs[0], "--method", "task_arithmetic", "--backbone-spec", spec,
                  "-o", str(tmp_path / "twice.parquet")])


def test_the_workflow_audits_releases_and_merges_and_the_ledger_composes_them(tmp_path):
    """config `audit:` on a tiny grid: rows per task and kind, the merged model's rows, the table and figure, and
    a ledger that counts the audit runs in each task's composition."""
    import json
    import subprocess

    import yaml

    from workflow_runs import SNAKEMAKE, snakemake_env

    config = {
        # two seeds for the linear combination below and the noise study; audits run on the first
        "results": "results", "seeds": [0, 1], "epsilons": [4], "methods": ["naive_dp"],
        "backbones": {"effnet": {"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32,
                                 "tasks": ["digits", "textures"], "finetune": {"lr": 0.002}}},
        "data": {"max_train": 48, "max_test": 24},
        "finetune": {"epochs": 0.4, "batch_size": 8, "lr": 0.001},
        "merge": {"weight_averaging": {}}, "tables": {"operator": "weight_averaging"},
        "diagnostics": {"seeds": 1, "interpolation": {"operator": "weight_averaging", "points": 2, "max_examples": 8},
                        "curvature": {"operator": "weight_averaging", "iterations": 2, "gammas": [0.0, 1.0],
                                      "max_examples": 8},
                        "landscape": {"operator": "weight_averaging"}},
        "audit": {"methods": ["naive_dp"], "kinds": ["white_box", "black_box"],
                  "canaries": {"white_box": 64, "black_box": 16}, "merge": ["weight_averaging"]},
        # the epsilon sweep's budget is audited too: the table has a row per budget
        "sweeps": {"epsilon": {"epsilons": [8], "methods": ["naive_dp"]}},
        # a release at epsilon 6 mixed from those at 4 and 8 (tests/test_mix_stage.py has the rest of mixing)
        "mix": {"targets": [6, 8], "methods": ["naive_dp"], "operator": "weight_averaging",
                # and at 8, the average of the two seeds' releases at 4 (two runs at 4 compose to less than 8)
                "combine": {"copies": 2, "budget": 4, "target": 8}},
        # the effective-noise study (tests/test_noise_scale.py has its pieces): one more release group at 2 x lr,
        # the configured run and the epsilon sweep's 8, each at both seeds
        "noise_scale": {"methods": ["naive_dp"], "seeds": 2, "lr_factors": [2], "batch_sizes": [], "weight_decays": [],
                        "epsilons": [8], "operator": "weight_averaging", "max_examples": 8},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    install_test_key(tmp_path / "results")
    done = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "2", "--configfile",
                           str(tmp_path / "config.yaml")], capture_output=True, text=True, env=snakemake_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = tmp_path / "results"
    rows = pd.read_parquet(results / "audits/individual/effnet/eps4/naive_dp/s0/digits.black_box.parquet").iloc[0]
    assert (rows["canaries"], rows["verdict"], rows["target_epsilon"]) == (16, "PASS", 4.0)
    merged = pd.read_parquet(results / "audits/merged/effnet/eps4/naive_dp/s0/weight_averaging.white_box.parquet")
    assert list(merged["task"]) == ["digits", "textures"] and set(merged["model"]) == {"merged"}
    run = results / "private/audits/effnet/eps4/naive_dp/s0/digits.white_box.pt"
    assert (run.stat().st_mode & 0o777) == 0o600
    pooled = pd.read_parquet(results / "audits/pooled/effnet/eps4/naive_dp.white_box.parquet").set_index("model")
    assert list(pooled.index) == ["individual", "merged"] and (pooled["canaries"] == 2 * 64).all()
    assert json.loads(pooled.loc["individual", "pooled_runs"]) == ["digits/s0", "textures/s0"]
    check = json.loads((results / "privacy/ledger_check.json").read_text())
    # per budget: 2 tasks x 2 kinds, then merged, then pooled individual and merged per kind
    assert (check["verdict"], check["audits"]) == ("PASS", 2 * (2 * 2 + 2 * 2 + 2 * 2))
    ledger_md = (results / "privacy/ledger.md").read_text()
    assert "## Empirical audits" in ledger_md
    # digits: a release per seed at each budget, the lr variant's per seed, and two audit runs (white- and
    # black-box) of seed 0 at each budget, composed
    assert re.search(r"^\| digits \| effnet \| replace_one \| 6 \| 0 \| 4 \| ", ledger_md, re.M), ledger_md
    assert "| effnet | naive_dp | 0 | 0 | 0.004 | 8 | 0.01 | 4.0 | 0 | 2 |" in ledger_md, ledger_md
    summary = pd.read_parquet(results / "tables/audit.parquet")
    assert list(summary["target_epsilon"]) == [4.0, 8.0] and (summary["verdict"] == "PASS").all()
    assert summary["claimed_epsilon"].iloc[0] < summary["claimed_epsilon"].iloc[1]
    assert summary["white_box individual canaries"].tolist() == [128, 128]
    assert (results / "figures/audit.png").stat().st_size > 0
    table = pd.read_parquet(results / "tables/mixing.parquet")
    assert list(zip(table["target_epsilon"], table["release"])) == [(6.0, "selection"), (8.0, "combination"),
                                                                     (8.0, "selection")]
    mixing = table.iloc[0]
    assert (mixing["backbone"], mixing["method"], mixing["target_epsilon"], mixing["components"]) == \
        ("effnet", "naive_dp", 6.0, "4, 8")
    # by its PLD the release calibrated by RDP to 8 may already meet 6 alone: p may put all weight on it
    assert 0 < mixing["mixture_epsilon"] <= 6.0 and 0 <= mixing["p_largest"] <= 1
    assert mixing["combination_epsilon"] > 8.0 and 0 <= mixing["mixed_score"] <= 100
    mixed = results / "mixtures/taskvectors/effnet/eps6/naive_dp/s0/digits.safetensors"
    assert read_metadata(mixed)["mixture"]["component_epsilons"] == [4.0, 8.0]
    # mixtures and combinations are logged as functions of their components, and the ledger above composed only
    # the trained releases (6 for digits)
    from dpmerge.privacy.release_log import read_entries

    logged = {f["path"]: entry for entry in read_entries(results / "private/releases.jsonl") for f in entry["files"]}
    for path in ("mixtures/taskvectors/effnet/eps6/naive_dp/s0/digits.safetensors",
                 "mixtures/combined/taskvectors/effnet/eps8/naive_dp/s0/digits.safetensors"):
        assert logged[path]["post_processing_of"], path
    # every audit run is logged before its rows are written (merged and pooled audits read only kept runs), and
    # a run of other settings at a logged path is refused before any job (Snakemake would delete its rows)
    audit_runs = [path for path, entry in logged.items() if entry["files"][0]["artifact"] == "audit"]
    assert len(audit_runs) == 2 * 2 * 2 and all(path.startswith("audits/individual/") for path in audit_runs)
    more = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "2", "-n", "--configfile",
                           str(tmp_path / "config.yaml"), "--config", "audit={canaries: {white_box: 32}}"],
                          capture_output=True, text=True, env=snakemake_env())
    assert more.returncode != 0 and "4 release(s) would be made again" in more.stdout + more.stderr
    assert "white_box.parquet: audit.canaries 64 -> 32" in more.stdout + more.stderr
    # the combination: both seeds' releases at 4 averaged, at their composition, paired with seed 0's selection and
    # trained release at 8 (one pair: no interval)
    combined = table.iloc[1]
    assert combined["components"] == "2 × 4" and 4.0 < combined["mixture_epsilon"] <= 8.0
    assert combined["seeds"] == 1 and math.isnan(combined["p_largest"]) and math.isnan(combined["versus_selection_low"])
    seed0 = {kind: pd.read_parquet(results / f"{folder}/effnet/eps8/naive_dp/s0/weight_averaging.parquet")
             ["score"].mean() for kind, folder in (("selection", "mixtures/scores"), ("trained", "scores/merged"))}
    assert combined["versus_selection"] == pytest.approx(combined["mixed_score"] - seed0["selection"])
    assert combined["difference"] == pytest.approx(combined["mixed_score"] - seed0["trained"])
    vector = results / "mixtures/combined/taskvectors/effnet/eps8/naive_dp/s0/digits.safetensors"
    parts = [load_tensors(results / f"taskvectors/effnet/eps4/naive_dp/s{s}/digits.safetensors")[0] for s in (0, 1)]
    averaged, record = load_tensors(vector)
    assert record["mixture"]["component_seeds"] == [0, 1]
    assert record["spent_epsilon"] <= combined["mixture_epsilon"] + 1e-9
    assert all(torch.allclose(averaged[n], (parts[0][n] + parts[1][n]) / 2, atol=1e-6) for n in averaged)
    assert (results / "figures/mixing.png").stat().st_size > 0
    noise = pd.read_parquet(results / "tables/noise_scale.parquet").set_index("sweep")
    assert sorted(noise.index) == ["centre", "epsilon", "lr"] and (noise["tasks"] == 2).all()
    # from what ran (the records): twice the lr, the same sigma; the larger budget, a smaller sigma
    assert noise.loc["lr", "lr"] == pytest.approx(2 * noise.loc["centre", "lr"])
    assert noise.loc["lr", "noise_multiplier"] == pytest.approx(noise.loc["centre", "noise_multiplier"])
    assert noise.loc["lr", "noise_scale_dp"] / noise.loc["centre", "noise_scale_dp"] == pytest.approx(2, rel=1e-2)
    assert noise.loc["epsilon", "noise_multiplier"] < noise.loc["centre", "noise_multiplier"]
    assert (noise["noise_scale"] >= noise["noise_scale_dp"]).all() and noise["optimum_noise_scale"].isna().all()
    # each setting over both seeds, with an interval; the readings pair the seeds (no non-private run: no T*)
    assert (noise["seeds"] == 2).all() and (noise["merge_gain_low"] <= noise["merge_gain_high"]).all()
    readings = pd.read_parquet(results / "tables/noise_scale_readings.parquet")
    assert set(readings["reading"]) == {"(c) Spearman ρ(log T, merged − own)", "(c) Spearman ρ(log T, merged)",
                                        "exploratory: merged − own, setting − configured"}
    assert (readings["seeds"] == 2).all()
    assert (results / "figures/noise_scale.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("audit,message", [
    ({"methods": ["dp_sam"]}, "audit.methods: 'dp_sam' is not among the configured methods"),
    ({"methods": ["pretrained_head"]}, "audit.methods: 'pretrained_head' trains a head on w0"),
    ({"methods": ["naive_dp"], "epsilons": [2]}, "audit.epsilons: 2 is not a released budget"),
    ({"methods": ["naive_dp"], "backbones": ["vit"]}, "audit.backbones: unknown backbone 'vit'"),
    ({"methods": ["naive_dp"], "merge": ["dts_difference"]}, "audit.merge: 'dts_difference' needs data statistics"),
    ({"methods": ["naive_dp"], "merge": ["fisher"]}, "audit.merge: 'fisher' needs data statistics"),
    ({"methods": ["naive_dp"], "merge": ["tsv_m"]}, "audit.merge: 'tsv_m' is not among the configured merges"),
    ({"methods": ["naive_dp"], "delta": 1e-3}, "audit.delta: 0.001 with 1000 white_box canaries in each of the"),
])
def test_an_audit_that_cannot_run_is_refused_with_the_config(audit, message):
    import yaml

    from dpmerge.config_check import ConfigError, check_config
    from workflow_runs import TINY

    config = yaml.safe_load(yaml.safe_dump(TINY))
    config["methods"].append("pretrained_head")
    config["audit"] = audit
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)


@pytest.mark.slow
def test_a_black_box_audit_bounds_each_group_of_classes_and_the_ledger_counts_its_run_once(tmp_path, wide,
                                                                                          study_key):
    from dpmerge.privacy.audit_ledger import build_audit_ledger, check_audits
    from dpmerge.privacy.ledger import task_composition
    from dpmerge.stages.audit import audit, audit_report
    from privacy_records import ledger, release

    backbone = wide[0]
    key = study_key
    out = tmp_path / "grouped.parquet"
    audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"},
          data=prepared_task(tmp_path, "toy", backbone, 3),
          method="naive_dp", hparams={"epochs": 4, "batch_size": 100, "lr": 0.03, "clip_norm": 1.0}, epsilon=2.0,
          seed=0, study_key=str(key), out=str(out), canaries=300, kind="black_box", groups={"first": ["a", "b"]})
    rows = pd.read_parquet(out).set_index("group")
    assert list(rows.index) == ["all", "first", "rest"]
    assert rows.loc["first", "canaries"] + rows.loc["rest", "canaries"] == rows.loc["all", "canaries"] == 300
    audits = build_audit_ledger([str(out)])
    assert check_audits(audits) == []
    composed = task_composition(ledger(release("toy", epsilon=2.0)), audits=audits).iloc[0]
    assert composed["private_audit_runs"] == 1  # three rows, one run
    audit_report(audit_files=[str(out)], out_prefix=str(tmp_path / "table"), figure=[str(tmp_path / "f.png")])
    assert len(pd.read_parquet(tmp_path / "table.parquet")) == 1
    assert "| toy | toy | naive_dp | 2.00 | 0 | black_box | first | 150 | " in (tmp_path / "table.md").read_text()
    # the group's classes are chosen first, up to half the canaries (a and b have about 200 held-out examples)
    assert rows.loc["first", "canaries"] == 150
    first = rows.loc["first"]
    assert first["auc_minus_rest_low"] < first["auc_minus_rest"] < first["auc_minus_rest_high"]
    assert first["auc_minus_rest"] == pytest.approx(first["auc"] - rows.loc["rest", "auc"])
    assert math.isnan(rows.loc["rest", "auc_minus_rest"]) and 0 <= rows.loc["all", "auc"] <= 1
    with pytest.raises(ValueError, match="'z'.*is not a class of toy"):
        audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"}, data=str(tmp_path / "toy.pt"),
              method="naive_dp", hparams={"epochs": 1, "batch_size": 100, "clip_norm": 1.0}, epsilon=2.0, seed=0,
              study_key=str(key), out=str(tmp_path / "bad.parquet"), canaries=300, kind="black_box",
              groups={"first": ["z"]})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["white_box", "black_box"])
def test_every_audit_draws_its_own_canaries_by_its_full_identity(tmp_path, wide, study_key, kind):
    """Rule 4: two audits that differ only in the seed (or the budget) share no coins, and the same audit
    reproduces its own."""
    from dpmerge.stages.audit import audit

    data = prepared_task(tmp_path, "toy", wide[0], 5)
    coins = {}
    for name, seed, epsilon in (("a", 0, 2.0), ("again", 0, 2.0), ("seed", 1, 2.0), ("budget", 0, 4.0)):
        audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"}, data=data, method="naive_dp",
              hparams={"epochs": 0.2, "batch_size": 100, "clip_norm": 1.0}, epsilon=epsilon, seed=seed,
              study_key=str(study_key), out=str(tmp_path / f"{name}.parquet"), canaries=200, kind=kind,
              keep_run=str(tmp_path / f"{name}.pt"))
        coins[name] = torch.load(tmp_path / f"{name}.pt", weights_only=True)["included"]
    assert torch.equal(coins["a"], coins["again"])
    assert not torch.equal(coins["a"], coins["seed"]) and not torch.equal(coins["a"], coins["budget"])


@pytest.mark.slow
def test_an_audit_run_is_a_release_the_ledger_composes_after_its_file_is_replaced_or_deleted(tmp_path, wide,
                                                                                              study_key):
    """A release is forever (privacy/release_log.py): an audit's rows are computed from a run on the task's data,
    so they are logged before they are written; another run at the same path is refused unless allowed, and the
    ledger composes every logged run, also one whose file is gone."""
    from dpmerge.privacy.release_log import file_sha256, publish, read_entries, release_log_path
    from dpmerge.stages.audit import audit
    from dpmerge.stages.ledger import ledger
    from privacy_records import release

    data, out, log = prepared_task(tmp_path, "toy", wide[0], 5), tmp_path / "audits/toy.parquet", \
        release_log_path(study_key)

    def audit_at(epsilon, **allowed):
        audit(backbone="toy", backbone_spec={"kind": "efficientnet_lite0"}, data=data, method="naive_dp",
              hparams={"epochs": 0.2, "batch_size": 100, "clip_norm": 1.0}, epsilon=epsilon, seed=0,
              study_key=str(study_key), out=str(out), canaries=200, **allowed)

    audit_at(2.0)
    (entry,) = read_entries(log)
    assert entry["files"] == [{"path": f"{tmp_path.name}/audits/toy.parquet", "artifact": "audit",
                               "sha256": file_sha256(out)}]
    assert json.loads(entry["metadata"]["rows"][0]["privacy_record"])["target_epsilon"] == 2.0
    first = out.read_bytes()
    with pytest.raises(ValueError, match=r"toy.parquet was released before by another run .*replace_releases"):
        audit_at(4.0)
    assert out.read_bytes() == first and len(read_entries(log)) == 1  # refused before the run: nothing spent
    audit_at(4.0, replace_release=True)
    _, record = release("toy", epsilon=4.0, backbone="toy")
    vector = tmp_path / "toy.safetensors"
    publish(log, mechanism="fine-tune", record=record, where={"backbone": "toy", "task": "toy"},
            files=[(vector, {"w": torch.zeros(2)}, "task_vector")])

    def ledger_of(audits):
        outputs = {name: str(tmp_path / f"ledger.{name}") for name in ("parquet", "md", "json", "audits")}
        ledger(task_vectors=[str(vector)], audits=audits, release_log=str(log), out=outputs["parquet"],
               report=outputs["md"], check_out=outputs["json"], audits_out=outputs["audits"])
        return json.loads(Path(outputs["json"]).read_text()), Path(outputs["md"]).read_text()

    verdict, report = ledger_of([str(out)])
    assert verdict["verdict"] == "PASS" and verdict["earlier_audits"] == {"replaced": 1}
    assert "| toy | toy | replace_one | 1 | 0 | 2 |" in report  # one release, two audit runs composed
    assert "individual (replaced: from the release log)" in report
    out.unlink()
    verdict, report = ledger_of([])
    assert verdict["verdict"] == "PASS" and verdict["earlier_audits"] == {"deleted": 2}
    assert "| toy | toy | replace_one | 1 | 0 | 2 |" in report
    # rows the log does not hold (edited, or written outside the study's runs) are named
    rows = read_entries(log)[0]["metadata"]["rows"]
    pd.DataFrame([{**rows[0], "epsilon_lb": 0.0}]).to_parquet(out)
    with pytest.raises(ValueError, match="toy.parquet: its content matches no release the log holds"):
        ledger_of([str(out)])
