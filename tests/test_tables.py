"""Table 1 built from a small score frame whose answer is known."""

import pandas as pd
import pytest

from dpmerge.tables import table1, to_latex, to_markdown


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
    return pd.DataFrame(rows)


def test_table1_rows_values_and_improvement():
    table = table1(scores())
    assert list(table.columns) == ["a", "b", "Avg."]
    assert list(table.index) == [
        "Non-private Individual", "DP Individual", "DP-Merging Individual",
        "Non-private + Weight Averaging", "DP + Weight Averaging", "DP-Merging + Weight Averaging",
        "  improvement (Weight Averaging)",
        "Non-private + TIES", "DP + TIES", "DP-Merging + TIES", "  improvement (TIES)",
    ]
    assert table.loc["DP Individual"].tolist() == [60.0, 70.0, 65.0]
    assert table.loc["DP + Weight Averaging"].tolist() == pytest.approx([40.0, 50.0, 45.0])
    assert table.loc["DP-Merging + TIES"].tolist() == pytest.approx([48.0, 58.0, 53.0])
    assert table.loc["  improvement (TIES)"].tolist() == pytest.approx([3.0, 3.0, 3.0])


def test_markdown_and_latex_carry_the_numbers():
    table = table1(scores())
    markdown = to_markdown(table, "caption")
    assert "| DP + TIES | 45.0 | 55.0 | 50.0 |" in markdown
    latex = to_latex(table, "cap_tion & more", "tab:x")
    assert r"\toprule" in latex and r"\bottomrule" in latex and r"cap\_tion \& more" in latex
    assert r"\textit{+3.0}" in latex


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="lacks columns"):
        table1(pd.DataFrame({"model": [], "task": []}))


def test_ablation_rows_appear_when_their_runs_exist():
    frame = scores()
    ablation = frame[frame["method"] == "dp_merging"].assign(method="dp_anchor")
    ablation["score"] -= 2.0
    table = table1(pd.concat([frame, ablation]))
    assert "DP-Merging w/o flatness Individual" in table.index
    assert "DP-Merging w/o alignment + TIES" not in table.index  # no dp_sam runs
    assert table.loc["DP-Merging w/o flatness + TIES"].tolist() == pytest.approx([46.0, 56.0, 51.0])
    assert list(table.index).index("DP-Merging w/o flatness + TIES") > list(table.index).index("  improvement (TIES)")
