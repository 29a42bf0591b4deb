"""The mixing table and figure: merged models of releases mixed to a target epsilon (stages/mix.py) beside merged
models of releases trained at each budget.

Table (one row per backbone, method, target epsilon and kind of release): the release's epsilon (the largest
over tasks, recomputed from each record), the budgets mixed, the mean probability of the largest one (random
selection), the merged score and, where the study also trained at the target, that of the trained releases and
their paired difference per seed (with its 95 % interval from two seeds on); for a linear combination (the
average of independent repetitions at one budget, `dpmerge combine`) also its paired difference with selection
at the same target; and what a linear combination of all of a selection's components would cost (their
composition), to show why selection, not combination, reaches a budget between two.
Figure: merged score against epsilon, trained releases as lines, selections as open markers and combinations
as filled diamonds, per backbone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.report.figures import METHOD_STYLES, _pyplot, _save_all
from dpmerge.report.labels import METHOD_LABELS
from dpmerge.report.small_table import write_small_table
from dpmerge.report.tables import t_interval

COLUMNS = {"backbone": "backbone", "method": "method", "target_epsilon": "target eps", "release": "release",
           "mixture_epsilon": "eps (recomputed)", "components": "budgets mixed",
           "p_largest": "P(largest budget)", "mixed_score": "merged, mixed",
           "trained_score": "merged, trained at target",
           "difference": "mixed − trained", "versus_selection": "combination − selection",
           "combination_epsilon": "eps of a linear combination of all", "seeds": "seeds"}


def merged_averages(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per (backbone, method, target epsilon, seed): the merged model's score averaged over tasks."""
    return (scores.groupby(["backbone", "method", "target_epsilon", "seed"], as_index=False)["score"].mean())


def _by_seed(averages: pd.DataFrame, backbone, method, target) -> pd.Series:
    chosen = averages[(averages["backbone"] == backbone) & (averages["method"] == method)
                      & np.isclose(averages["target_epsilon"], target)]
    return chosen.set_index("seed")["score"]


def _paired(ours: pd.Series, theirs: pd.Series) -> tuple[float, float, float]:
    """mean of ours − theirs over the seeds both have, and its 95 % interval (NaN without two pairs)."""
    paired = (ours - theirs).dropna()
    return t_interval(paired.to_numpy())


def mixing_summary(mixed: pd.DataFrame, trained: pd.DataFrame, mixtures: pd.DataFrame,
                   combined: pd.DataFrame | None = None) -> pd.DataFrame:
    """`mixed`, `trained`, `combined`: merged score rows (stages/evaluate.py) of the selections, the trained
    releases and the combinations; `mixtures`: one row per mixed task vector (backbone, method, target_epsilon,
    task, release: selection or combination, recomputed_epsilon, p_largest, components, combination_epsilon), as
    stages/mix.py `mix_report` recomputes them from the records. A combination of seeds' chunk j is paired with
    the selection and the trained release of seed j."""
    mixed_avg, trained_avg = merged_averages(mixed), merged_averages(trained)
    combined_avg = merged_averages(combined) if combined is not None and len(combined) else mixed_avg.iloc[:0]
    rows = []
    keys = ["backbone", "method", "target_epsilon", "release"]
    for (backbone, method, target, release), entry in mixtures.groupby(keys, sort=True):
        selection = _by_seed(mixed_avg, backbone, method, target)
        ours = _by_seed(combined_avg, backbone, method, target) if release == "combination" else selection
        theirs = _by_seed(trained_avg, backbone, method, target)
        if release == "combination":  # chunk j stands beside seed j alone: the means are over the same seeds
            theirs = theirs[theirs.index.isin(ours.index)]
        difference, low, high = _paired(ours, theirs)
        versus, versus_low, versus_high = (_paired(ours, selection) if release == "combination"
                                           else (math.nan, math.nan, math.nan))
        rows.append({"backbone": backbone, "method": method, "target_epsilon": float(target), "release": release,
                     "mixture_epsilon": float(entry["recomputed_epsilon"].max()),
                     "components": entry["components"].iloc[0],
                     "p_largest": float(entry["p_largest"].mean()),
                     "mixed_score": float(ours.mean()) if len(ours) else math.nan,
                     "trained_score": float(theirs.mean()) if len(theirs) else math.nan,
                     "difference": difference, "difference_low": low, "difference_high": high,
                     "versus_selection": versus, "versus_selection_low": versus_low,
                     "versus_selection_high": versus_high,
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
    if column in ("difference", "versus_selection"):
        low, high = row[f"{column}_low"], row[f"{column}_high"]
        return f"{value:+.1f}" + ("" if math.isnan(low) else f" [{low:+.1f}, {high:+.1f}]")
    return f"{value:.3f}" if column in ("mixture_epsilon", "p_largest", "combination_epsilon") else f"{value:.1f}"


def write_mixing_table(summary: pd.DataFrame, prefix: str, caption: str) -> list[Path]:
    """<prefix>.parquet (numeric columns), .md and .tex (booktabs)."""
    return write_small_table(summary, prefix, caption, COLUMNS, _cell)


def plot_mixing(mixed: pd.DataFrame, trained: pd.DataFrame, out: list[str],
                combined: pd.DataFrame | None = None) -> None:
    """Per backbone: merged score (mean over seeds) against epsilon; trained releases as lines, selections as open
    markers of the same method's style, combinations as filled diamonds."""
    plt = _pyplot()
    mixed_avg, trained_avg = merged_averages(mixed), merged_averages(trained)
    combined_avg = merged_averages(combined) if combined is not None and len(combined) else mixed_avg.iloc[:0]
    backbones = sorted(set(mixed_avg["backbone"]))
    fig, axes = plt.subplots(1, len(backbones), figsize=(4.6 * len(backbones), 3.8), squeeze=False)
    for ax, backbone in zip(axes[0], backbones):
        for method in sorted(set(mixed_avg["method"])):
            line, marker, grey = METHOD_STYLES.get(method, ("-", "o", "0.3"))
            label = METHOD_LABELS.get(method, method)
            for frame, kind in ((trained_avg, "trained"), (mixed_avg, "mixed"), (combined_avg, "combined")):
                chosen = frame[(frame["backbone"] == backbone) & (frame["method"] == method)]
                means = chosen.groupby("target_epsilon")["score"].mean().sort_index()
                if not len(means):
                    continue
                if kind == "trained":
                    ax.plot(means.index, means.values, linestyle=line, marker=marker, color=grey,
                            label=f"{label}, trained at epsilon")
                elif kind == "mixed":
                    ax.scatter(means.index, means.values, marker=marker, s=70, facecolors="none", edgecolors=grey,
                               linewidths=1.5, label=f"{label}, selection at epsilon", zorder=3)
                else:
                    ax.scatter(means.index, means.values, marker="D", s=45, color=grey,
                               label=f"{label}, combination at epsilon", zorder=4)
        budgets = sorted(set(trained_avg["target_epsilon"]) | set(mixed_avg["target_epsilon"])
                         | set(combined_avg["target_epsilon"]))
        ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])  # the budgets themselves, not powers of ten
        ax.minorticks_off()
        ax.set(xlabel="epsilon (log scale)", ylabel="merged score, mean over tasks (0-100)", title=backbone)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save_all(fig, out)
    plt.close(fig)
