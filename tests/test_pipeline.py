"""End to end: a tiny config through the real Snakefile, then a rerun that does nothing; a changed merge
hyperparameter, an added budget or task, an edited table command rerun exactly what depends on them; config
errors stop before any job."""

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from conftest import install_test_key
from dpmerge.artifacts import PRIVACY_FIELDS, load_tensors
from dpmerge.config_check import ConfigError, check_config
from dpmerge.merge.registry import OPERATORS
from workflow_runs import ROOT, TINY, planned_jobs, snakemake, snakemake_env


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny")
    (workdir / "config.yaml").write_text(yaml.safe_dump(TINY))
    install_test_key(workdir / TINY["results"])
    result = snakemake(workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir


def test_outputs_hold_the_values_they_claim(finished_run):
    results = finished_run / "results"
    # every released task vector carries its privacy record and stays within budget
    ledger = pd.read_parquet(results / "privacy/ledger.parquet")
    assert len(ledger) == 14 and ledger["record_complete"].all()  # 8 main + 4 at epsilon 8 + 2 at rho 0.2
    assert ledger["target_epsilon"].dtype == float and (ledger["spent_epsilon"] <= ledger["target_epsilon"]).all()
    assert set(ledger["queries_per_step"]) == {1, 2}
    assert "PASS" in (results / "privacy/ledger.md").read_text()
    check = json.loads((results / "privacy/ledger_check.json").read_text())
    assert (check["verdict"], check["problems"], check["releases"]) == ("PASS", [], 14)
    _, meta = load_tensors(results / "taskvectors/effnet/eps4/dp_merging/s0/digits.safetensors")
    assert all(field in meta for field in PRIVACY_FIELDS)
    assert "losses" not in meta  # non-private training statistics never leave the job log
    assert meta["queries_per_step"] == 2 and meta["delta"] == pytest.approx(1 / 48)

    # the weight-averaging merge is w0 + the mean of the task vectors
    w0, _ = load_tensors(results / "pretrained/effnet.safetensors")
    vectors = [load_tensors(results / f"taskvectors/effnet/eps4/naive_dp/s0/{t}.safetensors")[0]
               for t in ("digits", "textures")]
    merged, merged_meta = load_tensors(results / "merged/effnet/eps4/naive_dp/s0/weight_averaging.safetensors")
    for name in w0:
        assert torch.allclose(merged[name], w0[name] + (vectors[0][name] + vectors[1][name]) / 2, atol=1e-6)
    assert merged_meta["tasks"] == ["digits", "textures"]

    # interpolation endpoints reproduce the individual and merged evaluations (same full test subsample)
    curve = pd.read_parquet(results / "diagnostics/interpolation/minilm/eps4/dp_merging/s0.parquet")
    cross = pd.read_parquet(results / "scores/individual/minilm/eps4/dp_merging/s0.parquet")
    assert cross["target_epsilon"].dtype == float and (cross["target_epsilon"] == 4).all()  # numbers, not labels
    assert len(cross) == 4 and set(zip(cross["source_task"], cross["task"])) == {
        (a, b) for a in ("bbc_topic", "bbc_next_sentence") for b in ("bbc_topic", "bbc_next_sentence")}
    individual = cross[cross["source_task"] == cross["task"]].set_index("task")
    merged_scores = pd.read_parquet(
        results / "scores/merged/minilm/eps4/dp_merging/s0/weight_averaging.parquet").set_index("task")
    for task, points in curve.groupby("task"):
        points = points.set_index("gamma")
        assert points.loc[0.0, "loss"] == pytest.approx(individual.loc[task, "loss"], rel=1e-5)
        assert points.loc[1.0, "loss"] == pytest.approx(merged_scores.loc[task, "loss"], rel=1e-5)

    # curvature: its functional loss reproduces the evaluations at both ends of the same subsample
    curvature = pd.read_parquet(results / "diagnostics/curvature/minilm/eps4/dp_merging/s0.parquet").set_index("task")
    assert set(curvature.index) == {"bbc_topic", "bbc_next_sentence"}
    for task, row in curvature.iterrows():
        assert row["task_loss"] == pytest.approx(individual.loc[task, "loss"], rel=1e-5)
        assert row["merged_loss"] == pytest.approx(merged_scores.loc[task, "loss"], rel=1e-5)
        assert row["merge_gap"] == pytest.approx(row["merged_loss"] - row["task_loss"])
        assert np.isfinite([row["sharpness"], row["lambda_max_at_task"], row["beta"], row["bound"]]).all()
        assert row["displacement"] > 0 and row["beta"] >= row["lambda_max_at_task"]

    # Table 1: the paper's rows and columns, scores on a 0-100 scale, improvement = difference
    table = pd.read_parquet(results / "tables/table1_effnet_eps4.parquet").set_index("row")
    assert (table.pop("seeds") == 1).all()
    gain = table.pop("Avg. improvement over DP")  # the paper's improvement column
    normalized = table.pop("Avg. normalized (%)")  # (merged - chance) / (individual - chance), in %
    assert list(table.columns) == ["digits", "textures", "Avg."]  # one seed: no std columns
    tasks = ["digits", "textures"]
    individual_scores = table.loc["DP-Merging Individual", tasks]
    chance = pd.read_parquet(results / "scores/individual/effnet/eps4/dp_merging/s0.parquet").groupby("task")[
        "chance"].first()[tasks]
    clear = individual_scores >= chance + 0.1 * (100 - chance)  # else blank: a ratio to a gap near 0 is noise
    assert normalized["DP-Merging + TIES"] == pytest.approx(
        (100 * (table.loc["DP-Merging + TIES", tasks] - chance) / (individual_scores - chance)).mean()
        if clear.all() else np.nan, nan_ok=True)
    assert normalized[["DP Individual", "DP-Merging Individual"]].isna().all()
    assert {"DP Individual", "DP-Merging Individual", "DP + Weight Averaging", "DP-Merging + TIES"} <= set(table.index)
    assert table.loc["  improvement (TIES)"].to_numpy() == pytest.approx(
        (table.loc["DP-Merging + TIES"] - table.loc["DP + TIES"]).to_numpy())
    assert gain["DP-Merging + TIES"] == pytest.approx(table.loc["  improvement (TIES)", "Avg."])
    assert gain.notna().sum() == len(TINY["merge"])  # one DP-Merging row per merge, blank elsewhere
    assert table.drop(index=[i for i in table.index if "improvement" in i]).abs().le(100).all().all()
    own = pd.read_parquet(results / "scores/individual/effnet/eps4/dp_merging/s0.parquet").query("source_task == task")
    assert table.loc["DP-Merging Individual", "digits"] == pytest.approx(own.set_index("task").loc["digits", "score"])
    assert "| DP + Weight Averaging |" in (results / "tables/table1_effnet_eps4.md").read_text()
    assert r"\toprule" in (results / "tables/table1_effnet_eps4.tex").read_text()
    assert (results / "figures/interpolation_minilm_eps4.png").read_bytes()[:4] == b"\x89PNG"

    # data-dependent merges: RegMean on the declared public dataset (free), Fisher privatized and composed
    _, regmean_meta = load_tensors(results / "merged/minilm/eps4/dp_merging/s0/regmean.safetensors")
    assert regmean_meta["statistics"]["source"] == "public"
    assert [(r["public_dataset"], r["examples"]) for r in regmean_meta["statistics"]["records"]] == \
        [("tweet_sentiment", 16)] * 2
    minilm_spent = ledger.query("backbone == 'minilm' and method == 'dp_merging'")["spent_epsilon"].astype(float)
    assert float(regmean_meta["release_epsilon"]) == minilm_spent.max()  # public statistics cost nothing
    statistics = pd.read_parquet(results / "privacy/merge_statistics.parquet")
    private = statistics.query("kind == 'fisher'")
    assert len(private) == 8 and (private["source"] == "private").all() and (private["examples"] == 32).all()
    # a Poisson sample at rate m/N of the 48 private examples, accounted as such
    assert np.allclose(private["sample_rate"], 32 / 48) and (private["neighbouring"] == "replace_one").all()
    main_grid = ledger[ledger["path"].str.contains(r"/eps4/(?:naive_dp|dp_merging)/s0/", regex=True)]
    spent = main_grid.set_index(["backbone", "method", "task"])["spent_epsilon"].astype(float)
    for row in private.itertuples():
        assert float(row.total_epsilon) > spent[(row.backbone, row.method, row.task)]
        assert float(row.statistic_epsilon) == 1.0 and float(row.noise_multiplier) > 0
    _, fisher_meta = load_tensors(results / "merged/effnet/eps4/naive_dp/s0/fisher.safetensors")
    assert fisher_meta["release_epsilon"] == max(r["total_epsilon"] for r in fisher_meta["statistics"]["records"])
    ledger_text = (results / "privacy/ledger.md").read_text()
    assert "Merge statistics" in ledger_text and "| public: lfw |" in ledger_text
    # digits is released at epsilon 4 (two methods), 8 (two) and rho 0.2, and Fisher read it twice (the main
    # groups): all published together is their composition, more than any one of them
    composed = re.search(r"^\| digits \| effnet \| replace_one \| 5 \| 2 \| 0 \| ([0-9.]+) \| ([0-9.]+) \| "
                         r"[0-9.e-]+ \| 0 \| ([0-9.]+) \|", ledger_text, re.M)
    assert composed and 8.0 >= float(composed.group(1)) and float(composed.group(2)) > 8.0
    assert composed.group(3) == f"{float(composed.group(2)):.4g}"  # no non-private release: the same
    assert "Threat model" in ledger_text and "replace one example by another, N public" in ledger_text

    # the study key: private, and in no release, log or table
    key_file = results / "private/study.key"
    assert key_file.stat().st_mode & 0o077 == 0
    key = key_file.read_text().strip()
    for path in results.rglob("*"):
        if path.is_file() and path != key_file:
            assert key.encode() not in path.read_bytes(), path
    assert {"DP + RegMean", "DP-Merging + Fisher", "DP + DTS-D (per-task models)"} <= set(table.index)
    # DTS-D: one model per task, each scored on its own task; the extra storage per task is recorded
    _, dts_meta = load_tensors(results / "merged/effnet/eps4/dp_merging/s0/dts_difference.safetensors")
    assert 0 < dts_meta["personalized"]["extra_storage_per_task"] < 1
    dts_scores = pd.read_parquet(results / "scores/merged/effnet/eps4/dp_merging/s0/dts_difference.parquet")
    assert sorted(dts_scores["task"]) == ["digits", "textures"] and (dts_scores["model"] == "dts_difference").all()

    drift = pd.read_parquet(results / "diagnostics/drift/effnet/eps4/naive_dp/s0.parquet")
    assert (drift["drift"] > 0).all() and drift["mean_drift"].iloc[0] == pytest.approx(drift["drift"].mean())


def merged_average(results, backbone, eps, method, operator):
    return pd.read_parquet(results / f"scores/merged/{backbone}/{eps}/{method}/s0/{operator}.parquet")["score"].mean()


def test_paper_tables_figures_and_report(finished_run):
    results = finished_run / "results"
    # Table 4: the TIES averages of both budgets, from the sweep's own fine-tunes at epsilon 8
    table4 = pd.read_parquet(results / "tables/table4_epsilon_sweep.parquet").set_index("row")
    assert list(table4.index) == ["ε = 4", "ε = 8"]
    for eps in (4, 8):
        dp = merged_average(results, "effnet", f"eps{eps}", "naive_dp", "ties")
        ours = merged_average(results, "effnet", f"eps{eps}", "dp_merging", "ties")
        assert table4.loc[f"ε = {eps}", ["effnet DP", "effnet DP-Merging", "effnet improvement"]].tolist() == \
            pytest.approx([dp, ours, ours - dp])
    ledger = pd.read_parquet(results / "privacy/ledger.parquet")
    swept = ledger.query("backbone == 'effnet' and target_epsilon.astype('str') == '8.0'")
    assert len(swept) == 4 and (swept["spent_epsilon"].astype(float) <= 8.0).all()

    # Table 6: DP-Merging at the configured rho (0.05) and the swept one (0.2), with the naive DP reference
    _, meta = load_tensors(results / "taskvectors/effnet/eps4/dp_merging-rho0.2/s0/digits.safetensors")
    assert meta["method"] == "dp_merging" and meta["rho"] == 0.2 and meta["anchor_lambda"] == 0.05
    table6 = pd.read_parquet(results / "tables/table6_rho_effnet.parquet").set_index("row")
    assert list(table6.index) == ["DP (naive)", "ρ = 0.05", "ρ = 0.2"]
    assert table6.loc["ρ = 0.2", "Avg."] == pytest.approx(
        merged_average(results, "effnet", "eps4", "dp_merging-rho0.2", "ties"))
    assert table6.loc["ρ = 0.05", "Avg."] == pytest.approx(
        merged_average(results, "effnet", "eps4", "dp_merging", "ties"))

    # Table 8 and the GLUE-style language table; Tables 5 and 7 are skipped with their reasons
    table8 = pd.read_parquet(results / "tables/table8_operators_minilm_eps4.parquet").set_index("row")
    assert table8.loc["TIES", "Improvement"] == pytest.approx(
        table8.loc["TIES", "DP-Merging"] - table8.loc["TIES", "DP"])
    assert "bbc_topic (accuracy)" in pd.read_parquet(results / "tables/table1_minilm_eps4.parquet").columns
    index = (results / "tables/index.md").read_text()
    assert "Table 5 (ablation), effnet, eps4: methods lack dp_sam, dp_anchor" in index
    assert "Table 7 (lambda), effnet: no sweeps.anchor_lambda configured" in index
    assert "Table 6 (rho), minilm: sweeps.rho.backbones leaves minilm out" in index
    assert not list((results / "tables").glob("table5_*")) and not list((results / "tables").glob("table7_*"))
    for name in ("table1_effnet_eps4", "table4_epsilon_sweep", "table6_rho_effnet", "table8_operators_effnet_eps4"):
        assert (results / f"tables/{name}.tex").read_text().count(r"\toprule") == 1
        assert "<table>" in (results / f"tables/{name}.html").read_text()

    # curvature ran on the sweep's groups too (Fig. 3 has two budgets); landscapes of both methods
    assert (results / "diagnostics/curvature/effnet/eps8/dp_merging/s0.parquet").exists()
    # joint-task linearity of the one task pair, with the curvature file's lambda_max in its bound
    linearity = pd.read_parquet(results / "diagnostics/linearity/effnet/eps4/dp_merging/s0.parquet")
    curvature = pd.read_parquet(results / "diagnostics/curvature/effnet/eps4/dp_merging/s0.parquet").set_index("task")
    assert list(linearity["alpha"]) == [0.25, 0.5, 0.75] and set(linearity["task_s"] + linearity["task_t"]) == {
        "digitstextures"}
    w = {t: load_tensors(results / f"taskvectors/effnet/eps4/dp_merging/s0/{t}.safetensors")[0]
         for t in ("digits", "textures")}
    distance_squared = sum(float(((w["digits"][k] - w["textures"][k]).double() ** 2).sum()) for k in w["digits"])
    lambdas = curvature.loc["digits", "lambda_max_at_task"] + curvature.loc["textures", "lambda_max_at_task"]
    assert linearity["bound"].tolist() == pytest.approx(
        [0.5 * a * (1 - a) * lambdas * distance_squared for a in (0.25, 0.5, 0.75)], rel=1e-4)
    assert np.isfinite(linearity["delta"]).all()
    landscape = pd.read_parquet(results / "diagnostics/landscape/effnet/eps4/dp_merging/s0.parquet")
    centre = landscape.query("a == 0 and b == 0").set_index("task")["loss"]
    assert len(landscape.query("task == 'mean'")) == 9 and set(centre.index) == {"digits", "textures", "mean"}
    assert centre["mean"] == pytest.approx((centre["digits"] + centre["textures"]) / 2)
    for figure in ("sharpness_drift_effnet", "gap_vs_bound_minilm", "landscape_effnet_eps4",
                   "interpolation_effnet_eps4"):
        assert (results / f"figures/{figure}.png").read_bytes()[:4] == b"\x89PNG"
        assert (results / f"figures/{figure}.pdf").read_bytes()[:4] == b"%PDF"

    # one self-contained HTML report with every table and figure, captioned and grouped
    report = finished_run / "report.html"
    made = snakemake(finished_run, "--report", str(report))
    assert made.returncode == 0, made.stderr[-3000:]
    page = report.read_text()
    for needle in ("table4_epsilon_sweep.html", "table6_rho_effnet.html", "landscape_effnet_eps4.png",
                   "sharpness_drift_minilm.png", "gap_vs_bound_effnet.png", "index.md", "ledger.md",
                   "Theorem 5.2", "Sensitivity (Tables 6, 7)", "Loss landscapes (Figs. 4, 5)"):
        assert needle in page, needle


def test_a_fresh_study_directory_releases_differently_and_its_own_key_reproduces(finished_run, tmp_path):
    """Same config, new directory: a new study key, so other releases with the same records; the directory's
    own key gives the same release again."""
    target = "results/taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(TINY))
    result = snakemake(tmp_path, target)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    theirs, their_record = load_tensors(finished_run / target)
    ours, our_record = load_tensors(tmp_path / target)
    # the records cannot tell the studies apart: all they differ in is each file's hash of its own tensors,
    # which are public and differ anyway
    assert our_record.pop("tensors_sha256") != their_record.pop("tensors_sha256")
    assert our_record == their_record
    assert not all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert (tmp_path / "results/private/study.key").read_text() != \
        (finished_run / "results/private/study.key").read_text()
    released = tmp_path / target
    released.chmod(0o644)  # protected() released it read-only; retrain on purpose
    released.unlink()
    result = snakemake(tmp_path, target)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    again, _ = load_tensors(released)
    assert all(torch.equal(again[k], ours[k]) for k in ours)


def test_released_task_vectors_and_heads_are_write_protected(finished_run):
    import stat

    released = list((finished_run / "results/taskvectors").rglob("*.safetensors"))
    released += list((finished_run / "results/heads").rglob("*.safetensors"))
    assert len(released) == 2 * len(list((finished_run / "results/taskvectors").rglob("*.safetensors"))) > 0
    assert all(stat.S_IMODE(path.stat().st_mode) & 0o222 == 0 for path in released)


def test_second_run_does_nothing(finished_run):
    result = snakemake(finished_run, "-n")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


def test_a_changed_checkpoint_interval_or_replace_permission_reruns_nothing_even_without_the_profile(finished_run):
    # neither is a setting of any release: not a param, and not in the command's text (Snakemake's code trigger)
    for entry in ("checkpoint_every=3", "privacy={replace_releases: true}"):
        result = snakemake(finished_run, "-n", "--config", entry)
        assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr, entry


def test_changed_merge_hyperparameter_reruns_only_merges_and_downstream(finished_run):
    changed = yaml.safe_load((finished_run / "config.yaml").read_text())
    changed["merge"]["ties"]["density"] = 0.5
    config = finished_run / "changed.yaml"
    config.write_text(yaml.safe_dump(changed))
    result = snakemake(finished_run, "-n", "--configfile", str(config), "--rerun-triggers", "params", "mtime", "input")
    assert result.returncode == 0, result.stderr[-2000:]
    # TIES runs in the main grid's group jobs (2 backbones x 2 methods; each rewrites its individual scores too,
    # hence the signal check) and in its own jobs in effnet's epsilon-8 (2 methods) and rho-0.2 groups; Tables
    # 4, 6 and 8 read TIES too; no fine-tuning, and no diagnostic (they read weight averaging, never in a group job)
    assert planned_jobs(result.stdout + result.stderr) == {
        "merge_group": 4, "merge": 3, "table1": 2, "table4": 1, "table6": 1, "table8": 2, "signal_check": 1,
        "answer": 1, "all": 1}


def test_changed_statistics_setting_reruns_only_those_statistics_and_downstream(finished_run):
    changed = yaml.safe_load((finished_run / "config.yaml").read_text())
    changed["merge"]["fisher"]["statistics"]["epsilon"] = 2.0
    config = finished_run / "changed_statistics.yaml"
    config.write_text(yaml.safe_dump(changed))
    # a private statistic is a release: another one at its path is the user's explicit choice (tests/
    # test_release_log.py), and then only those statistics and what reads them rerun
    result = snakemake(finished_run, "-n", "--configfile", str(config), "--rerun-triggers", "params", "mtime", "input")
    assert result.returncode != 0 and "4 release(s) would be made again" in result.stdout + result.stderr
    changed.setdefault("privacy", {})["replace_releases"] = True
    config.write_text(yaml.safe_dump(changed))
    result = snakemake(finished_run, "-n", "--configfile", str(config), "--rerun-triggers", "params", "mtime", "input")
    assert result.returncode == 0, result.stderr[-2000:]
    assert planned_jobs(result.stdout + result.stderr) == {
        "merge_statistics": 4, "merge": 4, "table1": 2, "table8": 2, "privacy_ledger": 1, "answer": 1, "all": 1}


def _dry_run_with(finished_run, name, change):
    changed = yaml.safe_load((finished_run / "config.yaml").read_text())
    change(changed)
    config = finished_run / name
    config.write_text(yaml.safe_dump(changed))
    result = snakemake(finished_run, "-n", "--configfile", str(config), "--rerun-triggers", "params", "mtime", "input")
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    jobs = re.findall(r"rule (\w+):\n(?:    .*\n)*?    wildcards: (.*)\n", output)
    return planned_jobs(output), [(rule, dict(pair.split("=", 1) for pair in w.split(", "))) for rule, w in jobs]


def test_added_epsilon_adds_only_its_fine_tunes_and_what_depends_on_them(finished_run):
    counts, jobs = _dry_run_with(finished_run, "add_epsilon.yaml", lambda c: c.update(epsilons=[4, 2]))
    # 2 backbones x 2 methods at the new budget: 2 tasks each; per group one job scoring its models with TIES and
    # DTS, 3 merges of their own (RegMean and Fisher read statistics, the diagnostics weight averaging), 2
    # statistics and every diagnostic; that budget's Tables 1 and 8 and figures; the cross-budget Table 4, Fig. 3,
    # gap plot; the signal check, which reads every individual score
    assert counts == {"finetune": 8, "merge_group": 4, "merge": 12, "merge_statistics": 8,
                      "drift": 4, "interpolation": 4, "curvature": 4, "linearity": 4, "landscape": 4, "table1": 2,
                      "table8": 2, "figure_interpolation": 2, "figure_landscape": 2, "table4": 1,
                      "figure_sharpness_drift": 2, "figure_gap_bound": 2, "privacy_ledger": 1, "tables_index": 1,
                      "signal_check": 1, "answer": 1, "all": 1}
    assert all(w["eps"] == "eps2" for _, w in jobs if "eps" in w)  # nothing of the epsilon-4 groups reruns


def test_added_task_adds_only_its_fine_tunes_and_what_depends_on_them(finished_run):
    counts, jobs = _dry_run_with(finished_run, "add_task.yaml",
                                 lambda c: c["backbones"]["effnet"]["tasks"].append("photos"))
    # effnet's release groups: 2 methods at epsilon 4, 2 at the swept epsilon 8, DP-Merging at rho 0.2
    assert counts["prepare"] == 1 and counts["finetune"] == 5
    assert all(w["task"] == "photos" for rule, w in jobs if rule in ("prepare", "finetune"))
    # every merge of each effnet group, which now has one more task: its main groups' jobs (each with TIES and
    # DTS) and their 3 other merges; TIES and weight averaging at epsilon 8; TIES at rho 0.2
    assert counts["merge_group"] == 2 and counts["merge"] == 2 * 3 + 2 * 2 + 1
    assert all(w["backbone"] == "effnet" for _, w in jobs)  # MiniLM's results stand
    assert "pretrained" not in counts


def test_edited_table_command_reruns_only_tables(finished_run, tmp_path):
    """Code changes are a rerun trigger only where asked for; then a table rule's new command reruns the tables
    alone, never a fine-tune."""
    workflow = tmp_path / "wf"
    shutil.copytree(ROOT / "workflow", workflow / "workflow",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    shutil.copy(ROOT / "Snakefile", workflow / "Snakefile")
    rules = workflow / "workflow/rules/paper.smk"
    text = rules.read_text()
    assert text.count('"dpmerge table --kind multitask') == 1
    # the same command spelled differently: a code change that changes no result
    rules.write_text(text.replace('"dpmerge table --kind multitask', '"dpmerge table --kind=multitask'))
    env = snakemake_env()
    result = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(workflow / "Snakefile"),
                             "--directory", str(finished_run), "--cores", "2", "-n", "--rerun-triggers", "code"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert planned_jobs(result.stdout + result.stderr) == {"table1": 2, "answer": 1, "all": 1}


def test_all_five_methods_fan_out_with_one_nonprivate_reference_per_task(tmp_path):
    config = yaml.safe_load(yaml.safe_dump(TINY))
    config.update(methods=["nonprivate", "naive_dp", "dp_merging", "dp_sam", "dp_anchor"], epsilons=[1, 4])
    config.pop("sweeps")  # the main grid alone, so the counts below are its own
    config["finetune"]["by_method"] = {"dp_anchor": {"anchor_lambda": 0.3}}
    config["backbones"]["effnet"]["finetune"]["by_method"] = {"nonprivate": {"lr": 0.0003}}
    config["merge"]["ties_difference"] = {"operator": "ties", "vectors": "difference", "density": 0.3}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    listing = snakemake(tmp_path, "-n", "--printshellcmds")  # one dry run: each job's command, then the counts
    assert listing.returncode == 0, listing.stderr[-2000:]
    jobs = planned_jobs(listing.stdout + listing.stderr)
    tasks = 4
    # nonprivate runs once per task (epsinf); the four private methods once per task and epsilon
    assert jobs["finetune"] == tasks * (1 + 4 * 2)
    groups = 2 * (1 + 4 * 2)  # backbones x release groups
    # one job per group scores it with the merges that read only the releases (TIES, TIES on differences, DTS);
    # RegMean and Fisher (statistics) and weight averaging (the diagnostics') run one job per merge
    assert jobs["merge_group"] == groups and jobs["merge"] == groups * 3
    assert jobs["table1"] == 2 * 2  # per backbone and private epsilon
    assert "taskvectors/effnet/epsinf/nonprivate/s0/digits.safetensors" in listing.stdout
    assert "--method nonprivate  --seed 0" in listing.stdout  # no --epsilon for the non-private reference
    # the study's merges take releases only: --require-privacy-record refuses a vector without its record
    group_job = next(line for line in listing.stdout.splitlines()
                     if "dpmerge score-group" in line and "minilm/eps1/dp_anchor/s0" in line)
    assert "--require-privacy-record" in group_job
    merges = json.loads(group_job.split("--merges '")[1].split("'")[0])
    assert merges["ties_difference"] == {"method": "ties", "vectors": "difference", "params": {"density": 0.3}}
    assert "ties_difference=results/merged/minilm/eps1/dp_anchor/s0/ties_difference.safetensors" in group_job
    regmean = [line for line in listing.stdout.splitlines() if "dpmerge merge --method regmean " in line]
    assert len(regmean) == groups and all("--require-privacy-record" in line for line in regmean)
    # per-method overrides: global < global by_method < backbone < backbone by_method
    commands = [line for line in listing.stdout.splitlines() if "dpmerge finetune " in line]

    def hparams(backbone, method):
        line = next(c for c in commands if f"--backbone {backbone} " in c and f"--method {method} " in c)
        return json.loads(line.split("--hparams '")[1].split("'")[0])

    assert hparams("effnet", "nonprivate")["lr"] == 0.0003 and hparams("effnet", "naive_dp")["lr"] == 0.002
    assert hparams("minilm", "nonprivate")["lr"] == 0.001
    assert (hparams("minilm", "dp_anchor")["anchor_lambda"] == 0.3
            and hparams("minilm", "naive_dp")["anchor_lambda"] == 0.05)
    assert all("by_method" not in hparams(b, m) for b in ("effnet", "minilm") for m in ("nonprivate", "dp_sam"))


def test_the_schema_names_no_operator_and_the_check_refuses_an_unknown_one():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    entry = schema["properties"]["merge"]["additionalProperties"]
    assert "enum" not in entry["properties"]["operator"]
    config = yaml.safe_load(yaml.safe_dump(TINY))
    config["merge"] = {"magic": {}}
    with pytest.raises(ConfigError, match="merge.magic: no operator named 'magic'; give `operator:` one of "
                                          + ", ".join(OPERATORS)):
        check_config(config)


def test_sweeps_add_only_the_release_groups_and_merges_their_tables_need(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(TINY))
    listing = snakemake(tmp_path, "-n", "--printshellcmds")
    assert listing.returncode == 0, listing.stderr[-2000:]
    jobs = planned_jobs(listing.stdout + listing.stderr)
    main_groups, merges = 2 * 2, len(TINY["merge"])  # backbones x methods at epsilon 4
    # effnet at epsilon 8 (2 methods, TIES + the curvature diagnostic's weight averaging, curvature and
    # linearity) and at rho 0.2 (DP-Merging, TIES only, no curvature)
    assert jobs["finetune"] == 2 * (main_groups + 2 + 1)
    # the main groups' jobs each make TIES and DTS; their other merges (statistics, the diagnostics' weight
    # averaging) run one job each, as do the sweeps' merges
    assert jobs["merge_group"] == main_groups and jobs["merge"] == main_groups * (merges - 2) + 2 * 2 + 1
    assert "evaluate_individual" not in jobs and jobs["interpolation"] == main_groups
    assert jobs["curvature"] == jobs["linearity"] == main_groups + 2
    assert jobs["drift"] == main_groups + 2 + 1
    assert jobs["landscape"] == 2 * 2  # both backbones, both methods, first seed
    assert {k: jobs.get(k, 0) for k in ("table1", "table4", "table5", "table6", "table7", "table8")} == {
        "table1": 2, "table4": 1, "table5": 0, "table6": 1, "table7": 0, "table8": 2}
    assert "--method dp_merging-rho0.2 --epsilon 4.0 --seed 0" in listing.stdout


def test_denoised_merges_read_the_releases_denoised_and_the_ledger_holds_them_at_no_new_budget(finished_run, tmp_path):
    """A merge entry with denoise: its inputs are the releases denoised (dpmerge denoise), nothing is fine-tuned
    again, the ledger holds every denoised file beside its release and composes nothing for it, and the study's
    table pairs the entry with its plain twin."""
    workdir = tmp_path / "study"
    shutil.copytree(finished_run, workdir, symlinks=True)
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["merge"]["ties_denoised"] = {**config["merge"]["ties"], "operator": "ties", "denoise": "svd_shrink"}
    config["denoise_study"] = {"operators": ["ties_denoised"]}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    # the ledger and the study's tables only (the paper tables' rebuild is another test's business)
    result = snakemake(workdir, "results/privacy/ledger_check.json", "results/tables/denoised_releases.parquet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = planned_jobs((result.stdout + result.stderr).split("Select jobs")[0])
    # 2 backbones x 2 methods x 2 tasks denoised, one merge per main group; no training
    assert "finetune" not in jobs and jobs["denoise"] == 8 and jobs["merge"] == 4, jobs
    results = workdir / "results"
    check = json.loads((results / "privacy/ledger_check.json").read_text())
    assert (check["verdict"], check["releases"], check["post_processed"]) == ("PASS", 14, 8)
    before = json.loads((finished_run / "results/privacy/ledger_check.json").read_text())
    ledger = pd.read_parquet(results / "privacy/ledger.parquet")
    derived = ledger[ledger["post_processing_of"] != ""]
    assert len(derived) == 8 and (derived["mechanisms"] == "[]").all()
    assert before["private_releases"] == check["private_releases"]  # nothing more released, nothing composed
    _, merged_meta = load_tensors(results / "merged/effnet/eps4/naive_dp/s0/ties_denoised.safetensors")
    assert all(entry["path"].startswith("denoised/svd_shrink/taskvectors/") for entry in merged_meta["inputs"])
    table = pd.read_parquet(results / "tables/denoised_releases.parquet")
    assert len(table) == 2 and set(table["operator"]) == {"ties"} and table["dp_denoised_mean"].notna().all()
    noise = pd.read_parquet(results / "tables/denoised_releases_noise.parquet")
    assert (noise["noise_level"] > 0).all() and set(noise["method"]) == {"naive_dp", "dp_merging"}


def test_the_group_job_writes_what_the_per_file_commands_write(finished_run, tmp_path):
    """The main grid's groups are scored in one job (merge_group); its merged models and scores are those of
    'dpmerge merge' and 'dpmerge evaluate' run one file at a time on the same releases. The sweeps' groups and
    the merges that read statistics keep the per-file rules."""
    from dpmerge.cli import main

    results = finished_run / "results"
    group = "minilm/eps4/dp_merging/s0"
    tasks = TINY["backbones"]["minilm"]["tasks"]
    vectors = [str(results / f"taskvectors/{group}/{t}.safetensors") for t in tasks]
    heads = [str(results / f"heads/{group}/{t}.safetensors") for t in tasks]
    data = [str(results / f"data/minilm/{t}.pt") for t in tasks]
    base = str(results / "pretrained/minilm.safetensors")
    spec = json.dumps({key: value for key, value in TINY["backbones"]["minilm"].items()
                       if key in ("kind", "trainable_blocks", "max_length")})
    common = ["--backbone-spec", spec, "--base", base, "--heads", *heads, "--data", *data]
    main(["merge", "--method", "ties", "--param", "density=0.2", "--require-privacy-record", "--base", base,
          "-o", str(tmp_path / "ties.safetensors"), *vectors])
    main(["evaluate", *common, "--merged", str(tmp_path / "ties.safetensors"), "-o", str(tmp_path / "ties.parquet")])
    main(["evaluate", *common, "--task-vectors", *vectors, "-o", str(tmp_path / "individual.parquet")])

    ours, _ = load_tensors(tmp_path / "ties.safetensors")
    theirs, _ = load_tensors(results / f"merged/{group}/ties.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    columns = ["model", "source_task", "task", "score", "loss"]
    for mine, job in (("ties.parquet", f"scores/merged/{group}/ties.parquet"),
                      ("individual.parquet", f"scores/individual/{group}.parquet")):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / mine)[columns],
                                      pd.read_parquet(results / job)[columns])
    logs = results / "logs"
    assert (logs / f"merge_group/{group}.log").exists() and not (logs / f"merge/{group}/ties.log").exists()
    assert (logs / f"merge/{group}/fisher.log").exists()  # reads statistics: its own job
    assert (logs / "merge/effnet/eps8/dp_merging/s0/ties.log").exists()  # the epsilon sweep's group
