"""Presets (issues 5 and 6): the paper's DAG from its presets (dry run), and the stand-in preset end to end.

The paper presets cannot run here (no CLIP/RoBERTa weights, no datasets, no GPU), but their DAG is the paper's
experiment grid, so its job counts are checked against the grid the paper describes. The stand-in preset runs
the same code paths (open_clip loading, zero-shot heads, RoBERTa with a regression head, the real dataset
readers) on tiny random models and tiny datasets in the real formats."""

import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml

from workflow_runs import (
    ROOT,
    SNAKEMAKE,
    job_counts,
)

DPMERGE = [sys.executable, "-m", "dpmerge.cli"]


def preset(name: str) -> dict:
    return yaml.safe_load((ROOT / "presets" / name).read_text())


def test_paper_vision_preset_lists_the_papers_dag(tmp_path):
    counts = job_counts(tmp_path, "--configfile", str(ROOT / "presets/paper_vision.yaml"))
    backbones, tasks, operators = 3, 8, 7  # ViT-B/32, B/16, L/14; SUN397 ... DTD; WA, RegMean, TA, TIES, PCB, WUDI, ACE
    epsilons, private_methods = 4, 4  # {1, 2, 4, 8}; naive DP, DP-Merging, DP-SAM, DP-anchor (+ non-private)
    main_groups = backbones * (1 + private_methods * epsilons)
    sweep_rho, sweep_lambda = 4, 4  # ViT-B/32 at epsilon = 4: four more rho, four more lambda values
    assert counts["prepare"] == counts["zeroshot_head"] == backbones * tasks
    assert counts["pretrained"] == backbones
    pretrained_rows = backbones * epsilons  # pretrained_head: w0 with its zero-shot heads, nothing trained
    assert counts["finetune"] == (main_groups + sweep_rho + sweep_lambda + pretrained_rows) * tasks
    # a main group's job scores its individual models and the data-free merges no diagnostic reads (TIES, PCB,
    # WUDI, ACE); RegMean (statistics), weight averaging and task arithmetic (the diagnostics') run one job each,
    # as do the sensitivity runs' TIES (the tables' operator); the Pretrained rows are scored alone
    group_merges = 4
    assert counts["merge_group"] == main_groups and counts["evaluate_individual"] == pretrained_rows
    assert counts["merge"] == main_groups * (operators - group_merges) + sweep_rho + sweep_lambda
    assert "evaluate_merged" not in counts
    assert counts["merge_statistics"] == main_groups  # RegMean's privatized Grams, one file per release group
    assert counts["curvature"] == counts["linearity"] == main_groups
    assert counts["drift"] == main_groups + sweep_rho + sweep_lambda
    # Tables 1/2/10, 5 and 8 per backbone and budget; Tables 4, 6, 7 once
    assert counts["table1"] == counts["table5"] == counts["table8"] == backbones * epsilons
    assert counts["table4"] == counts["table6"] == counts["table7"] == 1
    assert counts["figure_sharpness_drift"] == counts["figure_gap_bound"] == backbones


def test_paper_glue_preset_lists_the_papers_dag(tmp_path):
    counts = job_counts(tmp_path, "--configfile", str(ROOT / "presets/paper_glue.yaml"))
    backbones, tasks, operators = 2, 8, 7
    main_groups = backbones * 5
    sweep_eps = 2 * 3  # RoBERTa-Large, (naive DP, DP-Merging) x eps {1, 2, 8} (Table 4, language)
    assert counts["prepare"] == backbones * tasks
    assert "zeroshot_head" not in counts  # RoBERTa trains its heads
    pretrained_rows = backbones  # pretrained_head: w0 and a head trained under DP at epsilon = 4
    assert counts["finetune"] == (main_groups + sweep_eps + pretrained_rows) * tasks
    # per main group one job with TIES, PCB, WUDI, ACE; RegMean, weight averaging and task arithmetic (the
    # diagnostics') one job each
    assert counts["merge_group"] == main_groups
    assert counts["merge"] == main_groups * (operators - 4) + sweep_eps * 2
    assert counts["table1"] == backbones and counts["table4"] == 1  # Tables 3 and 11; Table 4


def test_paper_presets_name_the_papers_settings():
    for name in ("paper_vision.yaml", "paper_glue.yaml"):
        config = preset(name)
        assert config["finetune"] == {
            "epochs": 10, "batch_size": 16, "clip_norm": 0.2, "lr": 1e-5, "weight_decay": 0.01,
            "betas": [0.9, 0.999], "rho": 0.05, "anchor_lambda": 0.05, "accountant": "pld"}
        # the paper's six operators (its Table 8), and ACE beside them: the strongest data-free rival to RegMean
        assert set(config["merge"]) == {"weight_averaging", "regmean", "task_arithmetic", "ties", "pcb", "wudi",
                                        "ace"}
    assert preset("paper_vision.yaml")["epsilons"] == [1, 2, 4, 8]
    glue = preset("paper_glue.yaml")
    assert glue["epsilons"] + glue["sweeps"]["epsilon"]["epsilons"] == [4, 1, 2, 8]


def test_a_preset_replaces_the_default_config_instead_of_extending_it(tmp_path):
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")  # the embedded default beside the preset
    counts = job_counts(tmp_path, "--configfile", str(ROOT / "presets/paper_glue.yaml"))
    assert counts["pretrained"] == 2  # the two RoBERTas only, not the default's EfficientNet and MiniLM


# --------------------------------------------------------------------------------------------- stand-in


@pytest.fixture(scope="module")
def standin_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("standin")
    made = subprocess.run([*DPMERGE, "make-standins", "--out", str(workdir / "standins")], capture_output=True,
                          text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    shutil.copytree(ROOT / "presets", workdir / "presets")
    # One method and the outputs below keep CI to ~40 jobs (~3 min; the whole preset with both methods, every
    # diagnostic and figure, is ~90); the two methods run the same code, the figures are tested on the default.
    results = "results_standin"
    targets = [f"{results}/tables/table1_{backbone}_eps4.parquet" for backbone in ("clip", "roberta")]
    targets += [f"{results}/privacy/ledger.md", f"{results}/diagnostics/curvature/clip/eps4/dp_merging/s0.parquet"]
    result = subprocess.run([*SNAKEMAKE, *targets, "--directory", str(workdir), "--cores", "2", "--configfile",
                             "presets/standin.yaml", "--config", 'methods=["dp_merging","pretrained_head"]'],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return workdir / "results_standin"


def test_standin_preset_runs_the_papers_code_paths(standin_run):
    from dpmerge.artifacts import load_tensors

    config = preset("standin.yaml")
    for backbone, entry in config["backbones"].items():
        table = pd.read_parquet(standin_run / f"tables/table1_{backbone}_eps4.parquet")
        columns = [c for c in table.columns if c.split(" (")[0] in entry["tasks"]]  # text: "stsb (spearman)"
        assert len(columns) == len(entry["tasks"])
        assert table[columns].notna().all().all()
    # CLIP: a frozen zero-shot head per task, released unchanged; task vectors under open_clip's names
    head, meta = load_tensors(standin_run / "zeroshot_heads/clip/mnist.safetensors")
    assert meta["privacy"] == "public" and len(meta["class_names"]) == head["weight"].shape[0]
    released, _ = load_tensors(standin_run / "heads/clip/eps4/dp_merging/s0/mnist.safetensors")
    assert all(torch.equal(released[k], head[k]) for k in head)
    vector, record = load_tensors(standin_run / "taskvectors/clip/eps4/dp_merging/s0/mnist.safetensors")
    assert "visual.transformer.resblocks.0.attn.in_proj_weight" in vector and record["queries_per_step"] == 2
    # RoBERTa: STS-B is a one-output regression head scored by Spearman
    head, _ = load_tensors(standin_run / "heads/roberta/eps4/dp_merging/s0/stsb.safetensors")
    assert head["out_proj.weight"].shape[0] == 1
    scores = pd.read_parquet(standin_run / "scores/individual/roberta/eps4/dp_merging/s0.parquet")
    assert set(scores.loc[scores["task"] == "stsb", "metric"]) == {"spearman"}
    assert "PASS" in (standin_run / "privacy/ledger.md").read_text()
    # The Pretrained row: CLIP's is w0 with its zero-shot heads (no query, nothing spent), RoBERTa's a DP head
    _, record = load_tensors(standin_run / "taskvectors/clip/eps4/pretrained_head/s0/mnist.safetensors")
    assert record["steps_by_queries"] == {} and record["spent_epsilon"] == 0.0
    _, record = load_tensors(standin_run / "taskvectors/roberta/eps4/pretrained_head/s0/stsb.safetensors")
    assert record["steps_by_queries"] == {"1": record["steps"]} and 0 < record["spent_epsilon"] <= 4.0
    for backbone in config["backbones"]:
        table = pd.read_parquet(standin_run / f"tables/table1_{backbone}_eps4.parquet")
        assert table["row"].iloc[0] == "Pretrained (w0, a head per task)"
    # RegMean's Grams read the datasets the preset declares public, through the CLIP tower's renaming
    for backbone, entry in config["backbones"].items():
        _, statistics = load_tensors(standin_run / f"statistics/{backbone}/eps4/dp_merging/s0/regmean.safetensors")
        assert statistics["source"] == "public" and statistics["public_dataset"] == entry["public_data"]
    # curvature's Hessian-vector products go through the CLIP tower's released <-> internal renaming
    curvature = pd.read_parquet(standin_run / "diagnostics/curvature/clip/eps4/dp_merging/s0.parquet")
    assert curvature[["sharpness", "lambda_max_at_task", "merge_gap"]].notna().all().all()


def test_standin_task_vectors_add_onto_an_open_clip_model(standin_run, tmp_path):
    """Interchangeable with other tools: w0 + tau loads into open_clip's own CLIP under its own keys."""
    import open_clip

    from dpmerge.artifacts import load_tensors

    config = standin_run.parent / "standins/clip"
    open_clip.add_model_config(config / "tiny-standin-ViT.json")
    model = open_clip.create_model("tiny-standin-ViT", pretrained=None)
    model.load_state_dict(torch.load(config / "open_clip_pytorch_model.bin", weights_only=True))
    merged, _ = load_tensors(standin_run / "merged/clip/eps4/dp_merging/s0/ties.safetensors")
    state = model.state_dict()
    state.update({key: state[key] + value for key, value in merged.items()})
    model.load_state_dict(state)  # strict: every key and shape is open_clip's


# ------------------------------------------------------------------------------------- demo and study

def test_the_demo_runs_the_main_question_only_and_the_study_adds_its_diagnostics(tmp_path):
    """make demo answers Table 1 (no ablations, no diagnostics); make study runs the same grid with every method
    and the diagnostics: the first runs in minutes only because the second holds the rest."""
    demo, study = yaml.safe_load((ROOT / "config.yaml").read_text()), preset("study.yaml")
    seeds = sum(len(b.get("seeds", demo["seeds"])) for b in demo["backbones"].values())  # a backbone's own or all
    backbones = len(demo["backbones"])
    tasks = {len(b["tasks"]) for b in demo["backbones"].values()}.pop()
    counts = job_counts(tmp_path / "demo", "--configfile", str(ROOT / "config.yaml"))
    methods = demo["methods"]
    assert {"dp_sam", "dp_anchor", "dp_sat", "dp_sat_anchor"}.isdisjoint(methods)
    assert counts["finetune"] == tasks * seeds * len(methods)
    merged = [m for m in methods if m != "pretrained_head"]  # the Pretrained row is scored, never merged
    # one job per release group makes and scores its merges (no diagnostic reads them) and its individual models
    assert counts["merge_group"] == seeds * len(merged) and "merge" not in counts
    assert counts["evaluate_individual"] == seeds  # the Pretrained row alone
    assert counts["table1"] == backbones and "answer" in counts and "privacy_ledger" in counts
    for diagnostic in ("drift", "curvature", "linearity", "interpolation", "table5", "figure_sharpness_drift"):
        assert diagnostic not in counts, f"the demo runs {diagnostic}"

    # the study's EfficientNet runs ten seeds (its averaging cells need them for a +-3 interval), the demo five
    study_seeds = sum(len(b.get("seeds", study["seeds"])) for b in study["backbones"].values())
    assert study_seeds > seeds
    for config in (study, demo):
        for backbone in config["backbones"].values():
            backbone.pop("seeds", None)
    assert {k: v for k, v in study.items() if k not in ("results", "methods", "diagnostics")} == \
        {k: v for k, v in demo.items() if k not in ("results", "methods", "diagnostics")}, \
        "the study is the demo's grid and budget on more methods"
    assert study["results"] != demo["results"]
    seeds = study_seeds
    counts = job_counts(tmp_path / "study", "--configfile", str(ROOT / "presets/study.yaml"))
    assert counts["finetune"] == tasks * seeds * len(study["methods"])
    assert counts["drift"] == seeds * (len(study["methods"]) - 1)
    assert counts["curvature"] == counts["linearity"] == backbones * study["diagnostics"]["seeds"] * \
        (len(study["methods"]) - 1)
    assert counts["table5"] == counts["table1"] == backbones
    assert counts["figure_sharpness_drift"] == backbones
