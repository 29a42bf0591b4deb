"""The mixing table and figure: merged models of releases mixed to a target epsilon (stages/mix.py) beside merged
models of releases trained at each budget.

Table (one row per backbone, method and target epsilon): the mixtures' epsilon (the largest over tasks,
recomputed from each mixture's record), the budgets mixed, the mean probability of the largest one, the merged
score of the mixtures and, where the study also trained at the target, of the trained releases and their paired
difference per seed (with its 95 % interval from two seeds on); and what a linear combination of all the
components would cost (their composition), to show why selection, not combination, reaches a budget between.
Figure: merged score against epsilon, trained releases as lines and mixtures as open markers, per backbone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.report.labels import METHOD_LABELS
from dpmerge.report.small_table import write_small_table

COLUMNS = {"backbone": "backbone", "method": "method", "target_epsilon": "target eps",
           "mixture_epsilon": "mixture eps (recomputed)", "components": "budgets mixed",
           "p_largest": "P(largest budget)", "mixed_score": "merged, mixed", "trained_score": "merged, trained at target",
           "difference": "mixed − trained", "combination_epsilon": "eps of a linear combination of all",
           "seeds": "seeds"}


def merged_averages(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per (backbone, method, target epsilon, seed): the merged model's score averaged over tasks."""
    return (scores.groupby(["backbone", "method", "target_epsilon", "seed"], as_index=False)["score"].mean())


def _interval(differences: np.ndarray) -> tuple[float, float]:
    if len(differences) < 2:
        return math.nan, math.nan
    from scipy.stats import t

    half = t.ppf(0.975, len(differences) - 1) * differences.std(ddof=1) / math.sqrt(len(differences))
    return float(differences.mean() - half), float(differences.mean() + half)


def mixing_summary(mixed: pd.DataFrame, trained: pd.DataFrame, mixtures: pd.DataFrame) -> pd.DataFrame:
    """`mixed`, `trained`: merged score rows (stages/evaluate.py); `mixtures`: one row per mixed task vector
    (backbone, method, target_epsilon, task, recomputed_epsilon, p_largest, components, combination_epsilon),
    as stages/mix.py `mix_report` recomputes them from the records."""
    mixed_avg, trained_avg = merged_averages(mixed), merged_averages(trained)
    rows = []
    for (backbone, method, target), entry in mixtures.groupby(["backbone", "method", "target_epsilon"], sort=True):
        ours = mixed_avg[(mixed_avg["backbone"] == backbone) & (mixed_avg["method"] == method)
                         & np.isclose(mixed_avg["target_epsilon"], target)].set_index("seed")["score"]
        theirs = trained_avg[(trained_avg["backbone"] == backbone) & (trained_avg["method"] == method)
                             & np.isclose(trained_avg["target_epsilon"], target)].set_index("seed")["score"]
        paired = (ours - theirs).dropna()
        low, high = _interval(paired.to_numpy())
        rows.append({"backbone": backbone, "method": method, "target_epsilon": float(target),
                     "mixture_epsilon": float(entry["recomputed_epsilon"].max()),
                     "components": entry["components"].iloc[0],
                     "p_largest": float(entry["p_largest"].mean()),
                     "mixed_score": float(ours.mean()) if len(ours) else math.nan,
                     "trained_score": float(theirs.mean()) if len(theirs) else math.nan,
                     "difference": float(paired.mean()) if len(paired) else math.nan,
                     "difference_low": low, "difference_high": high,
                     "combination_epsilon": float(entry["combination_epsilon"].max()), "seeds": int(len(ours))})
    return pd.DataFrame(rows)


def _cell(column: str, row) -> str:
    value = row[column]
    if column == "method":
        return METHOD_LABELS.get(value, value)
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):
        return str(value)
    if math.isnan(value):
        return "--"
    if column == "difference":
        low, high = row["difference_low"], row["difference_high"]
        return f"{value:+.1f}" + ("" if math.isnan(low) else f" [{low:+.1f}, {high:+.1f}]")
    return f"{value:.3f}" if column in ("mixture_epsilon", "p_largest", "combination_epsilon") else f"{value:.1f}"


def write_mixing_table(summary: pd.DataFrame, prefix: str, caption: str) -> list[Path]:
    """<prefix>.parquet (numeric columns), .md and .tex (booktabs)."""
    return write_small_table(summary, prefix, caption, COLUMNS, _cell)


def plot_mixing(mixed: pd.DataFrame, trained: pd.DataFrame, out: list[str]) -> None:
    """Per backbone: merged score (mean over seeds) against epsilon; trained releases as lines, mixtures as open
    markers of the same method's style."""
    from dpmerge.report.figures import METHOD_STYLES, _pyplot, _save_all

    plt = _pyplot()
    mixed_avg, trained_avg = merged_averages(mixed), merged_averages(trained)
    backbones = sorted(set(mixed_avg["backbone"]))
    fig, axes = plt.subplots(1, len(backbones), figsize=(4.6 * len(backbones), 3.8), squeeze=False)
    for ax, backbone in zip(axes[0], backbones):
        for method in sorted(set(mixed_avg["method"])):
            line, marker, grey = METHOD_STYLES.get(method, ("-", "o", "0.3"))
            label = METHOD_LABELS.get(method, method)
            for frame, kind in ((trained_avg, "trained"), (mixed_avg, "mixed")):
                chosen = frame[(frame["backbone"] == backbone) & (frame["method"] == method)]
                means = chosen.groupby("target_epsilon")["score"].mean().sort_index()
                if not len(means):
                    continue
                if kind == "trained":
                    ax.plot(means.index, means.values, linestyle=line, marker=marker, color=grey,
                            label=f"{label}, trained at epsilon")
                else:
                    ax.scatter(means.index, means.values, marker=marker, s=70, facecolors="none", edgecolors=grey,
                               linewidths=1.5, label=f"{label}, mixed to epsilon", zorder=3)
        budgets = sorted(set(trained_avg["target_epsilon"]) | set(mixed_avg["target_epsilon"]))
        ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])  # the budgets themselves, not powers of ten
        ax.minorticks_off()
        ax.set(xlabel="epsilon (log scale)", ylabel="merged score, mean over tasks (0-100)", title=backbone)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save_all(fig, out)
    plt.close(fig)
