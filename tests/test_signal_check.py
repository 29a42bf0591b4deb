"""Chance levels under every metric, the signal check built from score frames whose answer is known, and the
answer page's forest plot: a task whose labels carry nothing is flagged, a task that is learned is not."""

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score

from dpmerge.metrics import METRICS, chance_level, score
from dpmerge.report import forest
from dpmerge.report import signal_check as signal
from dpmerge.report.tables import table1, to_frame


def test_chance_is_what_an_input_blind_predictor_reaches():
    labels = np.array([0] * 60 + [1] * 30 + [2] * 10)
    assert chance_level("accuracy", labels) == pytest.approx(60.0)  # always the majority class
    assert chance_level("balanced_accuracy", labels) == pytest.approx(100 / 3)
    assert chance_level("macro_f1", labels) == pytest.approx(100 / 3)  # random guessing by the class shares
    assert chance_level("mcc", labels) == 0.0
    binary = np.array([1] * 25 + [0] * 75)
    assert chance_level("f1", binary) == pytest.approx(100 * 2 * 0.25 / 1.25)  # always positive
    # constant negative (0 + 75) / 2, constant positive (40 + 25) / 2; random by the shares (25 + 62.5) / 2 wins
    assert chance_level("f1_accuracy", binary) == pytest.approx((25.0 + 62.5) / 2)
    assert chance_level("spearman", np.linspace(0, 5, 30)) == 0.0
    with pytest.raises(ValueError, match="unknown metric"):
        chance_level("auc", binary)


@pytest.mark.slow
@pytest.mark.parametrize("metric", [m for m in METRICS if m != "spearman"])
def test_no_input_blind_predictor_beats_chance(metric):
    """Constant predictions and random ones drawn with the labels' shares stay at or below the chance level
    (random ones in expectation: averaged over many draws, within sampling error)."""
    rng = np.random.default_rng(0)
    labels = rng.choice(3 if metric not in ("f1", "f1_accuracy") else 2, size=400, p=None)
    chance = chance_level(metric, labels)
    for constant in np.unique(labels):
        assert score(metric, np.full_like(labels, constant), labels) <= chance + 1e-9
    shuffled = np.mean([score(metric, rng.permutation(labels), labels) for _ in range(200)])
    assert shuffled <= chance + 1.0


def test_balanced_accuracy_and_macro_f1_match_sklearn():
    rng = np.random.default_rng(1)
    labels, predictions = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    assert score("balanced_accuracy", predictions, labels) == pytest.approx(
        100 * balanced_accuracy_score(labels, predictions))
    assert score("macro_f1", predictions, labels) == pytest.approx(100 * f1_score(labels, predictions,
                                                                                  average="macro"))


def _individual(backbone, task, method, epsilon, values, chance, metric="accuracy"):
    return [dict(backbone=backbone, task=task, source_task=task, method=method, target_epsilon=epsilon, seed=seed,
                 model="individual", score=value, metric=metric, chance=chance) for seed, value in enumerate(values)]


def scores():
    """effnet: 'learned' is learned by every method; 'random' has labels that carry nothing (its private models
    sit at chance, 50, and scatter around it); 'weak' is learned, but privately only 20 % of the way."""
    rows = []
    rows += _individual("effnet", "learned", "nonprivate", "inf", [95, 96, 94], 10.0)
    rows += _individual("effnet", "learned", "naive_dp", 4.0, [80, 82, 81], 10.0)
    rows += _individual("effnet", "learned", "dp_merging", 4.0, [83, 84, 82], 10.0)
    rows += _individual("effnet", "random", "nonprivate", "inf", [51, 49, 52], 50.0)
    rows += _individual("effnet", "random", "naive_dp", 4.0, [48, 53, 50], 50.0)
    rows += _individual("effnet", "random", "dp_merging", 4.0, [50, 47, 54], 50.0)
    rows += _individual("effnet", "weak", "nonprivate", "inf", [91, 92, 90], 20.0)
    rows += _individual("effnet", "weak", "naive_dp", 4.0, [36, 37, 35], 20.0)
    rows += _individual("effnet", "weak", "dp_merging", 4.0, [60, 61, 62], 20.0)
    return pd.DataFrame(rows)


def test_the_signal_check_flags_a_task_at_chance_and_a_weak_one():
    frame = signal.signal_rows(scores())
    row = frame.set_index(["task", "method"]).loc[("learned", "naive_dp")]
    assert row["mean"] == pytest.approx(81.0) and row["ci95_low"] < 81 < row["ci95_high"]
    assert row["share_of_headroom"] == pytest.approx((row["ci95_low"] - 10) / 90)
    assert row["threshold"] == 0.3 and row["private"] and row["meets_threshold"]
    verdicts = signal.task_verdicts(frame).set_index("task")
    assert verdicts.loc["learned", "verdict"] == signal.PASSES
    assert verdicts.loc["random", "verdict"] == signal.NO_SIGNAL
    assert verdicts.loc["random", "methods"] == "DP, ε = 4, DP-Merging, ε = 4"
    assert verdicts.loc["weak", "verdict"] == signal.WEAK and verdicts.loc["weak", "methods"] == "DP, ε = 4"
    line = signal.summary_line(frame)
    assert "1 of 3 tasks carries no signal" in line and "1 of 3 tasks is weak" in line
    assert "effnet/random" in line and "effnet/weak" in line
    assert "effnet/learned" not in line


def test_thresholds_are_the_callers(tmp_path):
    frame = signal.signal_rows(scores(), private_share=0.1, nonprivate_share=0.99)
    verdicts = signal.task_verdicts(frame).set_index("task")
    assert verdicts.loc["weak", "verdict"] == signal.WEAK  # now the non-private models miss 0.99
    assert "Non-private" in verdicts.loc["weak", "methods"] and "DP, ε = 4" not in verdicts.loc["weak", "methods"]
    paths = signal.write_signal_check(frame, str(tmp_path / "signal"))
    assert pd.read_parquet(paths[0])["mean"].dtype == float  # numeric, not formatted
    markdown = paths[1].read_text()
    assert "| effnet | random (accuracy) | 50.0 |" in markdown
    assert "no signal (DP, ε = 4, DP-Merging, ε = 4)" in markdown
    assert "non-private 0.99" in markdown and "private 0.1" in markdown


def test_the_thresholds_default_alike_in_the_schema_the_command_and_the_module():
    import yaml

    from dpmerge.cli_arguments import build_parser
    from workflow_runs import ROOT

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    fields = schema["properties"]["tables"]["properties"]["signal_check"]["properties"]
    args = build_parser().parse_args(["signal-check", "--scores", "s.parquet", "--out-prefix", "x"])
    assert fields["nonprivate_share"]["default"] == args.nonprivate_share == signal.NONPRIVATE_SHARE
    assert fields["private_share"]["default"] == args.private_share == signal.PRIVATE_SHARE


def test_one_seed_reads_the_point_estimate_and_says_so():
    one = scores().query("seed == 0")
    frame = signal.signal_rows(one)
    assert frame["ci95_low"].isna().all()
    assert "point estimate stands in" in signal.note(frame)
    assert signal.task_verdicts(frame).set_index("task").loc["random", "verdict"] == signal.NO_SIGNAL


def test_score_files_without_chance_are_refused_by_name():
    with pytest.raises(ValueError, match=r"lack column\(s\) \['chance'\]"):
        signal.signal_rows(scores().drop(columns="chance"))
    mixed = scores()
    mixed.loc[0, "chance"] = 12.0
    with pytest.raises(ValueError, match="effnet/learned: the score files disagree on the chance level"):
        signal.signal_rows(mixed)


def _merged(method, operator, seed, values):
    return [dict(backbone="effnet", task=t, source_task="merged", method=method, target_epsilon=4.0, seed=seed,
                 model=operator, score=v, metric="accuracy", chance=10.0) for t, v in zip(("a", "b"), values)]


def test_the_forest_plot_pairs_each_cell_by_seed(tmp_path):
    rows = []
    for seed in range(3):
        for method, base in (("naive_dp", 40.0), ("dp_merging", 45.0 + seed), ("pretrained_head", 50.0)):
            rows += [dict(backbone="effnet", task=t, source_task=t, method=method, target_epsilon=4.0, seed=seed,
                          model="individual", score=base + 20, metric="accuracy", chance=10.0) for t in ("a", "b")]
            if method != "pretrained_head":
                rows += _merged(method, "ties", seed, (base, base + 2))
    table = to_frame(table1(pd.DataFrame(rows)))
    cells = forest.forest_rows({"effnet, ε = 4": table}, lambda t: ["TIES"])
    against_dp = cells.set_index("comparison").loc[forest.AGAINST_DP]
    assert against_dp["mean"] == pytest.approx(6.0) and against_dp["seeds"] == 3  # 5, 6, 7
    assert against_dp["ci95_low"] < 6.0 < against_dp["ci95_high"]
    against_w0 = cells.set_index("comparison").loc[forest.AGAINST_PRETRAINED]
    assert against_w0["mean"] == pytest.approx(46.0 + 1 - 70.0)  # merged averages 46, 47, 48; Pretrained 70
    forest.plot_forest(cells, [tmp_path / "forest.png", tmp_path / "forest.pdf"])
    assert (tmp_path / "forest.png").stat().st_size > 1000 and (tmp_path / "forest.pdf").exists()
    assert not math.isnan(against_w0["ci95_low"])


def test_a_task_with_random_labels_is_flagged_on_the_answer_page(tmp_path):
    """A tiny study of a learnable task (colour per class) and a task whose labels are random (noise images in
    two class folders): the pipeline's signal check flags the random one as carrying no signal, the answer page
    shows the check and names it, and the learnable one passes."""
    import subprocess

    import yaml
    from PIL import Image

    from conftest import install_test_key
    from tiny_files import write_image_folder, write_tiny_resnet
    from workflow_runs import SNAKEMAKE, snakemake_env

    write_image_folder(tmp_path / "data" / "colours", classes=("blue", "red"), per_class=60)
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        folder = tmp_path / "data" / "noise" / name
        folder.mkdir(parents=True)
        for index in range(60):
            Image.fromarray(rng.integers(0, 256, (20, 26, 3)).astype(np.uint8)).save(folder / f"{index}.png")
    write_tiny_resnet(tmp_path / "models" / "resnet.safetensors")
    config = {
        "results": "results", "seeds": [0, 1, 2], "epsilons": [8], "methods": ["nonprivate", "naive_dp"],
        "own_tasks": {"colours": {"images": "data/colours"}, "noise": {"images": "data/noise"}},
        "backbones": {"resnet": {"kind": "timm", "model": "test_resnet", "checkpoint": "models/resnet.safetensors",
                                 "trainable_blocks": 1, "image_size": 32, "tasks": ["colours", "noise"]}},
        "finetune": {"epochs": 5, "batch_size": 16, "lr": 0.05},
        "merge": {"weight_averaging": {}, "task_arithmetic": {}}, "diagnostics": {"seeds": 0},
        "tables": {"operator": "weight_averaging"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    install_test_key(tmp_path / "results")
    run = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "2", "results/answer.md"],
                         capture_output=True, text=True, env=snakemake_env())
    assert run.returncode == 0, run.stderr[-3000:]
    frame = pd.read_parquet(tmp_path / "results" / "tables" / "signal_check.parquet")
    verdicts = signal.task_verdicts(frame).set_index("task")["verdict"]
    assert verdicts["noise"] == signal.NO_SIGNAL, frame
    assert verdicts["colours"] == signal.PASSES, frame
    assert (frame.loc[frame["task"] == "noise", "chance"] == 50.0).all()  # balanced test split
    answer = (tmp_path / "results" / "answer.md").read_text()
    assert "## Signal check" in answer and "resnet/noise" in answer and "carries no signal" in answer
    # no DP-Merging here, so the forest plot has nothing to show: drawn all the same, saying so, and not linked
    assert (tmp_path / "results/figures/answer_forest.png").exists() and "answer_forest" not in answer
