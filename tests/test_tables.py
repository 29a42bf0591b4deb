"""Paper tables built from small score frames whose answers are known: means and sample standard deviations
(ddof=1) over seeds, improvements as paired per-seed differences."""

import math

import numpy as np
import pandas as pd
import pytest

from dpmerge.epsilon import epsilon_value
from dpmerge.report.tables import (
    PaperTable,
    table1,
    table_ablation,
    table_epsilon_sweep,
    table_operators,
    table_sensitivity,
    to_latex,
    to_markdown,
    write_table,
)

SQRT2 = math.sqrt(2.0)
GAIN = "Avg. improvement over DP"  # Table 1's improvement column
NORMALIZED = "Avg. normalized (%)"  # Table 1's merged / individual column
COLUMNS = ["a", "b", "Avg."]


CHANCE = {"a": 20.0, "b": 50.0}  # each task's chance level, as every score row records it


def scores():
    rows = []
    for method, base in (("nonprivate", 90.0), ("naive_dp", 60.0), ("dp_merging", 58.0)):
        for task, offset in (("a", 0.0), ("b", 10.0)):
            # individual: own task scores base+offset; the cross-task entry must be ignored
            rows.append(dict(model="individual", method=method, source_task=task, task=task, score=base + offset))
            other = "b" if task == "a" else "a"
            rows.append(dict(model="individual", method=method, source_task=task, task=other, score=-50.0))
            for op, drop in (("weight_averaging", 20.0), ("ties", 15.0)):
                bonus = 5.0 if method == "dp_merging" else 0.0
                for seed, jitter in ((0, -1.0), (1, 1.0)):  # mean over seeds
                    rows.append(dict(model=op, method=method, source_task="merged", task=task,
                                     score=base + offset - drop + bonus + jitter, seed=seed))
    frame = pd.DataFrame(rows)
    return frame.assign(chance=frame["task"].map(CHANCE))


def test_table1_rows_values_and_improvement():
    result = table1(scores())
    assert isinstance(result, PaperTable)
    table = result.mean
    assert list(table.columns) == ["a", "b", "Avg.", NORMALIZED, GAIN]
    assert list(table.index) == [
        "Non-private Individual", "DP Individual", "DP-Merging Individual",
        "Non-private + Weight Averaging", "DP + Weight Averaging", "DP-Merging + Weight Averaging",
        "  improvement (Weight Averaging)",
        "Non-private + TIES", "DP + TIES", "DP-Merging + TIES", "  improvement (TIES)",
    ]
    assert table.loc["DP Individual", COLUMNS].tolist() == [60.0, 70.0, 65.0]
    assert table.loc["DP + Weight Averaging", COLUMNS].tolist() == pytest.approx([40.0, 50.0, 45.0])
    assert table.loc["DP-Merging + TIES", COLUMNS].tolist() == pytest.approx([48.0, 58.0, 53.0])
    assert table.loc["  improvement (TIES)", COLUMNS].tolist() == pytest.approx([3.0, 3.0, 3.0])
    # the improvement column: DP-Merging's average minus DP's with the same operator, paired per seed
    assert table.loc["DP-Merging + TIES", GAIN] == pytest.approx(3.0) and result.std.loc["DP-Merging + TIES", GAIN] == 0
    assert table[GAIN].notna().sum() == 2  # only the DP-Merging rows (no ablation runs here)
    # seeds 0 and 1 differ by -1/+1 on every task, so every merged cell's std is sqrt(2) (per-seed averages
    # 44 and 46 for DP + Weight Averaging); the paired improvement is 3 in both seeds: std 0
    assert result.std.loc["DP + Weight Averaging", COLUMNS].tolist() == pytest.approx([SQRT2] * 3)
    assert result.std.loc["  improvement (TIES)", COLUMNS].tolist() == pytest.approx([0.0] * 3)
    assert result.std.loc["DP Individual"].isna().all()  # the individual rows have one (unnamed) seed
    assert result.seeds["DP Individual"] == 1 and result.seeds["DP + TIES"] == 2


def test_markdown_and_latex_carry_the_numbers():
    table = table1(scores())
    markdown = to_markdown(table, "caption")
    assert "| DP + TIES | 45.0 ± 1.4 | 55.0 ± 1.4 | 50.0 ± 1.4 |" in markdown
    assert "| DP Individual | 60.0 | 70.0 | 65.0 |" in markdown  # one seed: no ±
    assert "| improvement (TIES) | +3.0 [+3.0, +3.0]* | +3.0 [+3.0, +3.0]* | +3.0 [+3.0, +3.0]* |" in markdown
    latex = to_latex(table, "cap_tion & more", "tab:x")
    assert r"\toprule" in latex and r"\bottomrule" in latex and r"cap\_tion \& more" in latex
    assert r"DP + TIES & 45.0 $\pm$ 1.4 & 55.0 $\pm$ 1.4 & 50.0 $\pm$ 1.4 & 43.8 $\pm$ 5.3 & -- \\" in latex
    assert (r"DP-Merging + TIES & 48.0 $\pm$ 1.4 & 58.0 $\pm$ 1.4 & 53.0 $\pm$ 1.4 & 59.1 $\pm$ 5.8 & "
            r"\textit{+3.0 [+3.0, +3.0]*} \\") in latex
    assert r"\textit{+3.0 [+3.0, +3.0]*}" in latex
    assert r"DP Individual & 60.0 & 70.0 & 65.0 & -- & -- \\" in latex


def test_one_seed_prints_means_only_and_signs_differences():
    one = scores().query("seed != 1")
    table = table1(one)
    assert table.std is None
    markdown = to_markdown(table)
    assert "| DP + TIES | 44.0 | 54.0 | 49.0 |" in markdown
    assert "| improvement (TIES) | +3.0 | +3.0 | +3.0 |" in markdown
    assert r"\textit{+3.0} & \textit{+3.0} & \textit{+3.0} & \textit{+15.0} & -- \\" in to_latex(table)
    assert "| DP-Merging + TIES | 47.0 | 57.0 | 52.0 | 55.0 | +3.0 |" in markdown


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="lacks columns"):
        table1(pd.DataFrame({"model": [], "task": []}))


def test_ablation_rows_appear_when_their_runs_exist():
    frame = scores()
    ablation = frame[frame["method"] == "dp_merging"].assign(method="dp_anchor")
    ablation["score"] -= 2.0
    table = table1(pd.concat([frame, ablation])).mean
    assert "DP-Merging w/o flatness Individual" in table.index
    assert "DP-Merging w/o alignment + TIES" not in table.index  # no dp_sam runs
    assert table.loc["DP-Merging w/o flatness + TIES", COLUMNS + [GAIN]].tolist() == pytest.approx(
        [46.0, 56.0, 51.0, 1.0])
    assert list(table.index).index("DP-Merging w/o flatness + TIES") > list(table.index).index("  improvement (TIES)")


def merged(method, model, values, seed=0, backbone="vit", epsilon="4.0", **extra):
    """Score rows of one merged model: values = {task: score}."""
    return [dict(backbone=backbone, method=method, target_epsilon=epsilon, seed=seed, model=model,
                 source_task="merged", task=task, score=score, **extra) for task, score in values.items()]


def test_epsilon_value_reads_every_spelling():
    assert epsilon_value("4.0") == 4.0 and epsilon_value(1) == 1.0
    assert all(epsilon_value(v) == math.inf for v in ("None", "inf", None, "nan", float("inf"), "abc"))


def test_metric_in_header_names_each_tasks_metric():
    frame = scores().assign(metric=lambda f: f["task"].map({"a": "accuracy", "b": "mcc"}))
    table = table1(frame, metric_in_header=True)
    assert list(table.mean.columns) == ["a (accuracy)", "b (mcc)", "Avg.", NORMALIZED, GAIN]
    assert list(table.std.columns) == ["a (accuracy)", "b (mcc)", "Avg.", NORMALIZED, GAIN]
    assert table.mean.loc["DP + TIES"].tolist()[:3] == pytest.approx([45.0, 55.0, 50.0])
    assert f"| Method | a (accuracy) | b (mcc) | Avg. | {NORMALIZED} | {GAIN} |" in to_markdown(table)
    with pytest.raises(ValueError, match="lacks column 'metric'"):
        table1(scores(), metric_in_header=True)


def test_write_table_parquet_layout(tmp_path):
    paths = write_table(table1(scores()), tmp_path / "t1_eps0.5", "Caption <b>.")
    assert [p.name for p in paths] == ["t1_eps0.5.parquet", "t1_eps0.5.md", "t1_eps0.5.tex", "t1_eps0.5.html"]
    wide = pd.read_parquet(paths[0])
    columns = ["a", "b", "Avg.", NORMALIZED, GAIN]
    seeds = {"a": ["unseeded", "0", "1"], "b": ["unseeded", "0", "1"], "Avg.": ["unseeded", "0", "1"],
             NORMALIZED: ["0", "1"], GAIN: ["0", "1"]}
    assert list(wide.columns) == (["row", *columns] + [f"{c} std" for c in columns] + [f"{c} ci95 low" for c in columns]
                                  + [f"{c} ci95 high" for c in columns]
                                  + [f"{c} seed {s}" for c in columns for s in seeds[c]] + ["seeds"])
    row = wide.set_index("row").loc["DP + Weight Averaging"]
    assert row[["a", "b", "Avg."]].tolist() == pytest.approx([40.0, 50.0, 45.0])
    assert row[["a std", "b std", "Avg. std"]].tolist() == pytest.approx([SQRT2] * 3)
    # two seeds: t(0.975, 1) = 12.7062, half-width 12.7062 * sqrt(2) / sqrt(2)
    assert row[["a ci95 low", "a ci95 high"]].tolist() == pytest.approx([40 - 12.7062, 40 + 12.7062], abs=1e-4)
    assert row[["a seed 0", "a seed 1", "b seed 0", "b seed 1"]].tolist() == pytest.approx([39.0, 41.0, 49.0, 51.0])
    assert pd.isna(row["a seed unseeded"])
    assert row["seeds"] == 2
    assert wide.set_index("row").loc["DP Individual", "seeds"] == 1
    assert "45.0 ± 1.4" in paths[1].read_text() and r"\label{tab:t1_eps0.5}" in paths[2].read_text()
    page = paths[3].read_text()
    assert "<td>45.0 ± 1.4</td>" in page and "<th>DP + Weight Averaging</th>" in page
    assert "Caption &lt;b&gt;." in page  # escaped

    single = write_table(table1(scores().query("seed != 1")), tmp_path / "one", "Caption.")
    assert list(pd.read_parquet(single[0]).columns) == ["row", "a", "b", "Avg.", NORMALIZED, GAIN, "seeds"]


def test_plot_interpolation_is_still_importable_from_tables():
    from dpmerge.report import figures
    from dpmerge.report.figures import plot_interpolation

    assert plot_interpolation is figures.plot_interpolation


def sweep_scores():
    rows = []
    # vit, epsilon 1: two seeds. naive per-seed averages 45, 47; DP-Merging 52, 55; paired improvements 7, 8
    rows += merged("naive_dp", "ties", {"a": 40, "b": 50}, seed=0, epsilon="1.0")
    rows += merged("naive_dp", "ties", {"a": 42, "b": 52}, seed=1, epsilon="1.0")
    rows += merged("dp_merging", "ties", {"a": 50, "b": 54}, seed=0, epsilon="1.0")
    rows += merged("dp_merging", "ties", {"a": 50, "b": 60}, seed=1, epsilon="1.0")
    rows += merged("naive_dp", "weight_averaging", {"a": 0, "b": 0}, seed=0, epsilon="1.0")  # other operator
    # vit, epsilon 4: one seed; epsilon 8: naive DP only
    rows += merged("naive_dp", "ties", {"a": 60, "b": 70}, epsilon="4.0")
    rows += merged("dp_merging", "ties", {"a": 64, "b": 70}, epsilon="4.0")
    rows += merged("naive_dp", "ties", {"a": 80, "b": 90}, epsilon="8.0")
    # roberta: one task; epsilon 4 lacks DP-Merging
    rows += merged("naive_dp", "ties", {"c": 30}, backbone="roberta", epsilon="1.0")
    rows += merged("dp_merging", "ties", {"c": 35}, backbone="roberta", epsilon="1.0")
    rows += merged("naive_dp", "ties", {"c": 50}, backbone="roberta", epsilon="4.0")
    # non-private runs are no row of Table 4
    rows += merged("nonprivate", "ties", {"a": 99, "b": 99}, epsilon="None")
    return pd.DataFrame(rows)


def test_epsilon_sweep_table4():
    table = table_epsilon_sweep(sweep_scores())
    assert list(table.mean.index) == ["ε = 1", "ε = 4", "ε = 8"]
    assert list(table.mean.columns) == ["vit DP", "vit DP-Merging", "vit improvement",
                                        "roberta DP", "roberta DP-Merging", "roberta improvement"]
    assert table.mean.loc["ε = 1"].tolist() == pytest.approx([46.0, 53.5, 7.5, 30.0, 35.0, 5.0])
    assert table.std.loc["ε = 1", ["vit DP", "vit DP-Merging", "vit improvement"]].tolist() == pytest.approx(
        [SQRT2, math.sqrt(4.5), math.sqrt(0.5)])  # paired: std of (7, 8), not of the two means' difference
    assert table.mean.loc["ε = 4"].tolist() == pytest.approx([65.0, 67.0, 2.0, 50.0, np.nan, np.nan],
                                                             nan_ok=True)
    assert table.mean.loc["ε = 8"].tolist() == pytest.approx([85.0] + [np.nan] * 5, nan_ok=True)
    assert table.seeds.tolist() == [2, 1, 1]
    markdown = to_markdown(table)
    assert "| Privacy budget | vit DP |" in markdown
    assert "| ε = 1 | 46.0 ± 1.4 | 53.5 ± 2.1 | +7.5 [+1.1, +13.9]* | 30.0 | 35.0 | +5.0 |" in markdown
    assert r"$\varepsilon$ = 4 & 65.0 & 67.0 & \textit{+2.0} & 50.0 & -- & -- \\" in to_latex(table)


def test_epsilon_sweep_names_what_is_missing():
    with pytest.raises(ValueError, match="no merged scores of operator 'pcb'.*'ties'"):
        table_epsilon_sweep(sweep_scores(), operator="pcb")
    one_budget = sweep_scores().query("target_epsilon != '4.0'")
    with pytest.raises(ValueError, match=r"at least 2 finite epsilons.*in common: \[1.0\]"):
        table_epsilon_sweep(one_budget)


def ablation_scores():
    rows = []
    for method, base in (("naive_dp", 50), ("dp_sam", 55), ("dp_anchor", 56), ("dp_merging", 60)):
        seeds = (0, 2) if method == "dp_merging" else (0,)  # DP-Merging: seed 1 scores 2 points higher
        for seed, shift in zip((0, 1), seeds):
            for task, offset in (("a", 0), ("b", 10)):
                rows.append(dict(backbone="vit", method=method, target_epsilon="4.0", seed=seed, model="individual",
                                 source_task=task, task=task, score=base + offset + shift))
                rows.append(dict(backbone="vit", method=method, target_epsilon="4.0", seed=seed, model="individual",
                                 source_task=task, task="b" if task == "a" else "a", score=-100))  # not own task
            rows += merged(method, "ties", {"a": base - 10 + shift, "b": base + shift}, seed=seed)
            rows += merged(method, "weight_averaging", {"a": base - 20 + shift, "b": base - 10 + shift}, seed=seed)
    return pd.DataFrame(rows)


def test_ablation_table5():
    table = table_ablation(ablation_scores())
    assert list(table.mean.index) == ["DP", "w/o Alignment", "w/o Flatness", "DP-Merging (full)",
                                      "  improvement (w/o Alignment − DP)", "  improvement (w/o Flatness − DP)",
                                      "  improvement (DP-Merging (full) − DP)"]
    assert list(table.mean.columns) == ["Individual", "TIES", "Weight Averaging"]
    # paired per seed: DP has seed 0 only, so each difference rests on seed 0 (DP-Merging's seed 1 has no pair)
    assert table.mean.loc["  improvement (w/o Alignment − DP)"].tolist() == pytest.approx([5.0, 5.0, 5.0])
    assert table.mean.loc["  improvement (DP-Merging (full) − DP)"].tolist() == pytest.approx([10.0, 10.0, 10.0])
    assert table.seeds["  improvement (DP-Merging (full) − DP)"] == 1
    assert "| improvement (w/o Flatness − DP) | +6.0 | +6.0 | +6.0 |" in to_markdown(table)
    assert table.mean.loc["DP"].tolist() == pytest.approx([55.0, 45.0, 35.0])
    assert table.mean.loc["w/o Alignment"].tolist() == pytest.approx([60.0, 50.0, 40.0])
    assert table.mean.loc["w/o Flatness"].tolist() == pytest.approx([61.0, 51.0, 41.0])
    assert table.mean.loc["DP-Merging (full)"].tolist() == pytest.approx([66.0, 56.0, 46.0])
    assert table.std.loc["DP-Merging (full)"].tolist() == pytest.approx([SQRT2] * 3)
    assert table.std.loc["DP"].isna().all()
    assert "| DP-Merging (full) | 66.0 ± 1.4 | 56.0 ± 1.4 | 46.0 ± 1.4 |" in to_markdown(table)


def test_ablation_names_missing_methods_and_refuses_mixed_budgets():
    frame = ablation_scores()
    with pytest.raises(ValueError, match=r"needs runs of \['dp_sam', 'dp_anchor'\]"):
        table_ablation(frame[~frame["method"].isin(["dp_sam", "dp_anchor"])])
    other = frame[frame["method"] == "dp_sam"].assign(target_epsilon="1.0")
    with pytest.raises(ValueError, match="mix privacy budgets"):
        table_ablation(pd.concat([frame, other]))
    no_dp = table_ablation(frame[frame["method"] != "naive_dp"])
    assert list(no_dp.mean.index) == ["w/o Alignment", "w/o Flatness", "DP-Merging (full)"]  # nothing to pair


def rho_sweep(anchor_lambda=0.05):
    rows = merged("naive_dp", "ties", {"a": 45, "b": 55}, rho=0.0, anchor_lambda=0.0)
    for rho, seed, a, b in ((0.1, 0, 50, 60), (0.05, 0, 60, 70), (0.05, 1, 62, 74), (0.01, 0, 55, 65)):
        rows += merged("dp_merging", "ties", {"a": a, "b": b}, seed=seed, rho=rho, anchor_lambda=anchor_lambda)
        rows += merged("dp_merging", "weight_averaging", {"a": 0, "b": 0}, seed=seed, rho=rho,
                       anchor_lambda=anchor_lambda)
    return pd.DataFrame(rows)


def test_sensitivity_tables_6_and_7():
    table = table_sensitivity(rho_sweep(), "rho")
    assert list(table.mean.index) == ["DP (naive)", "ρ = 0.01", "ρ = 0.05", "ρ = 0.1"]
    assert list(table.mean.columns) == ["a", "b", "Avg."]
    assert table.mean.loc["DP (naive)"].tolist() == pytest.approx([45.0, 55.0, 50.0])
    assert table.mean.loc["ρ = 0.05"].tolist() == pytest.approx([61.0, 72.0, 66.5])
    assert table.std.loc["ρ = 0.05"].tolist() == pytest.approx([SQRT2, 2 * SQRT2, math.sqrt(4.5)])
    assert table.mean.loc["ρ = 0.1"].tolist() == pytest.approx([50.0, 60.0, 55.0])
    assert r"$\rho$ = 0.05 & 61.0 $\pm$ 1.4 & 72.0 $\pm$ 2.8 & 66.5 $\pm$ 2.1 \\" in to_latex(table)

    lambdas = rho_sweep().rename(columns={"rho": "anchor_lambda", "anchor_lambda": "rho"})
    table7 = table_sensitivity(lambdas, "anchor_lambda")
    assert list(table7.mean.index) == ["DP (naive)", "λ = 0.01", "λ = 0.05", "λ = 0.1"]
    assert table7.mean.loc["λ = 0.01"].tolist() == pytest.approx([55.0, 65.0, 60.0])


def test_sensitivity_needs_the_other_parameter_fixed_when_both_sweeps_are_present():
    rho = rho_sweep()
    lam = rho_sweep().rename(columns={"rho": "anchor_lambda", "anchor_lambda": "rho"}).query("method != 'naive_dp'")
    lam = lam[lam["anchor_lambda"] != 0.05].assign(score=lambda f: f["score"] - 30)  # lambda 0.01, 0.1 at rho 0.05
    both = pd.concat([rho, lam])
    with pytest.raises(ValueError, match="anchor_lambda also varies"):
        table_sensitivity(both, "rho")
    fixed = table_sensitivity(both, "rho", fixed={"anchor_lambda": 0.05})
    pd.testing.assert_frame_equal(fixed.mean, table_sensitivity(rho, "rho").mean)


def test_sensitivity_errors():
    with pytest.raises(ValueError, match=r"lacks columns \['rho'\]"):
        table_sensitivity(rho_sweep().drop(columns="rho"), "rho")
    with pytest.raises(ValueError, match=r"at least 2 distinct values.*\[0.05\]"):
        table_sensitivity(rho_sweep().query("rho == 0.05 or method == 'naive_dp'"), "rho")
    with pytest.raises(ValueError, match="must be one of"):
        table_sensitivity(rho_sweep(), "lr")
    old = pd.DataFrame(merged("dp_merging", "ties", {"a": 1, "b": 2}, seed=5))  # written before the rho column
    with pytest.raises(ValueError, match="2 score rows of dp_merging \\+ ties do not record rho"):
        table_sensitivity(pd.concat([rho_sweep(), old]), "rho")


def operator_scores():
    rows = []
    # TIES, two seeds: DP per-seed averages 55, 56; DP-Merging 60, 63; paired improvements 5, 7
    rows += merged("naive_dp", "ties", {"a": 50, "b": 60}, seed=0)
    rows += merged("naive_dp", "ties", {"a": 54, "b": 58}, seed=1)
    rows += merged("dp_merging", "ties", {"a": 56, "b": 64}, seed=0)
    rows += merged("dp_merging", "ties", {"a": 62, "b": 64}, seed=1)
    rows += merged("naive_dp", "task_arithmetic", {"a": 40, "b": 50})
    rows += merged("dp_merging", "task_arithmetic", {"a": 45, "b": 55})
    rows += merged("naive_dp", "weight_averaging", {"a": 1, "b": 1})  # no DP-Merging run: no row
    rows += merged("dp_merging", "dare", {"a": 1, "b": 1})  # no DP run: no row
    return pd.DataFrame(rows)


def test_operators_table8():
    table = table_operators(operator_scores())
    assert list(table.mean.index) == ["TIES", "Task Arithmetic"]
    assert list(table.mean.columns) == ["DP", "DP-Merging", "Improvement"]
    assert table.mean.loc["TIES"].tolist() == pytest.approx([55.5, 61.5, 6.0])
    # paired std of (5, 7) is sqrt(2); the unpaired combination sqrt(0.5 + 4.5) would be 2.24
    assert table.std.loc["TIES"].tolist() == pytest.approx([math.sqrt(0.5), math.sqrt(4.5), SQRT2])
    assert table.mean.loc["Task Arithmetic"].tolist() == pytest.approx([45.0, 50.0, 5.0])
    assert table.std.loc["Task Arithmetic"].isna().all()
    markdown = to_markdown(table)
    assert "| TIES | 55.5 ± 0.7 | 61.5 ± 2.1 | +6.0 [-6.7, +18.7] |" in markdown
    assert "| Task Arithmetic | 45.0 | 50.0 | +5.0 |" in markdown


def test_operators_table8_needs_an_operator_with_both_methods():
    frame = operator_scores()
    with pytest.raises(ValueError, match="no merge operator has runs of both naive_dp and dp_merging"):
        table_operators(frame[frame["method"] == "naive_dp"])


def test_a_seed_missing_a_task_has_no_average():
    rows = merged("naive_dp", "ties", {"a": 50, "b": 60}, seed=0) + merged("naive_dp", "ties", {"a": 70}, seed=1)
    rows += merged("dp_merging", "ties", {"a": 50, "b": 60}, seed=0)
    table = table_operators(pd.DataFrame(rows))
    assert table.mean.loc["TIES", "DP"] == pytest.approx(55.0)  # seed 1 lacks task b
    table = table1(pd.DataFrame(rows))
    assert table.mean.loc["DP + TIES", ["a", "b", "Avg."]].tolist() == pytest.approx([60.0, 60.0, 55.0])
    # seed 0 is the only seed with both methods' averages: 55 - 55
    assert table.mean.loc["DP-Merging + TIES", GAIN] == pytest.approx(0.0)


def test_improvements_carry_their_paired_95_percent_t_interval():
    """Three seeds with paired differences 1, 2, 3: mean 2, sd 1, t(0.975, 2) = 4.3027, half-width 2.4842;
    the interval [-0.5, +4.5] includes 0 (no star); differences 4, 5, 6 give [+2.5, +7.5] (starred)."""
    def frame(gains):
        rows = []
        for seed, gain in enumerate(gains):
            rows += [{"model": "ties", "method": "naive_dp", "task": "a", "score": 50.0, "seed": seed},
                     {"model": "ties", "method": "dp_merging", "task": "a", "score": 50.0 + gain, "seed": seed}]
        return pd.DataFrame(rows)

    table = table1(frame([1, 2, 3]))
    assert table.low.loc["  improvement (TIES)", "a"] == pytest.approx(2 - 2.4842, abs=1e-4)
    assert table.high.loc["  improvement (TIES)", "a"] == pytest.approx(2 + 2.4842, abs=1e-4)
    markdown = to_markdown(table)
    assert "| improvement (TIES) | +2.0 [-0.5, +4.5] | +2.0 [-0.5, +4.5] |" in markdown
    assert "| DP-Merging + TIES | 52.0 ± 1.0 | 52.0 ± 1.0 |  | +2.0 [-0.5, +4.5] |" in markdown
    assert markdown.rstrip().endswith("* marks an interval that excludes 0.")
    assert "| improvement (TIES) | +5.0 [+2.5, +7.5]* |" in to_markdown(table1(frame([4, 5, 6])))
    one_seed = to_markdown(table1(frame([4])))
    assert "| improvement (TIES) | +4.0 | +4.0 |" in one_seed and "t-interval" not in one_seed


def test_merged_rows_carry_the_normalized_average_measured_from_chance():
    """Per task 100 x (merged - chance) / (individual - chance), the individual models' mean over seeds, averaged
    over tasks, per seed. DP + TIES (chance 20 and 50; individual 60 and 70) gives 100 (24/40 + 4/20) / 2 = 40.0
    and 100 (26/40 + 6/20) / 2 = 47.5 for seeds 0 and 1."""
    table = table1(scores())
    assert table.mean.loc["DP + TIES", NORMALIZED] == pytest.approx(43.75)
    assert table.std.loc["DP + TIES", NORMALIZED] == pytest.approx(7.5 / SQRT2)
    # DP-Merging + TIES (individual 58 and 68): 100 (27/38 + 7/18) / 2 and 100 (29/38 + 9/18) / 2
    ours = [100 * (27 / 38 + 7 / 18) / 2, 100 * (29 / 38 + 9 / 18) / 2]
    assert table.mean.loc["DP-Merging + TIES", NORMALIZED] == pytest.approx(np.mean(ours))
    # the improvement row pairs the normalized averages per seed too
    assert table.mean.loc["  improvement (TIES)", NORMALIZED] == pytest.approx(np.mean(ours) - 43.75)
    assert table.mean.loc[["DP Individual", "DP-Merging Individual"], NORMALIZED].isna().all()
    assert any("(merged − chance) / (individual − chance)" in note for note in table.notes)


def test_normalized_average_is_blank_with_its_reason_where_an_individual_model_is_near_chance():
    """An individual model at (or just above) chance would make the ratio explode or flip: the method's merges
    get a blank, never a huge or negative number and never an average over the remaining tasks, and the table
    says why, naming the task."""
    for near_chance in (50.0, 52.0):  # task b's chance is 50; 52 is 4 % of the way to 100
        frame = scores()
        individual = ((frame["model"] == "individual") & (frame["method"] == "naive_dp") & (frame["task"] == "b"))
        frame.loc[individual, "score"] = near_chance
        table = table1(frame)
        assert np.isnan(table.mean.loc["DP + TIES", NORMALIZED])
        assert np.isfinite(table.mean.loc["DP-Merging + TIES", NORMALIZED])  # other methods keep theirs
        assert any(note.startswith(f"{NORMALIZED} is blank for DP's merges") and "b (chance 50.0" in note
                   for note in table.notes)
        assert "is blank for DP's merges" in to_markdown(table)


def test_normalized_average_is_blank_without_chance_levels():
    table = table1(scores().drop(columns="chance"))
    assert table.mean[NORMALIZED].isna().all()
    assert table.notes == (f"{NORMALIZED} is blank: the score files carry no chance level (scored before dpmerge "
                           "recorded one).",)
