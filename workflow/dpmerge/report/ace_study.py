"""ACE-Merging under DP: what ACE sees in private releases (its gate and the noise floor under each task's
estimated covariance) and how its stages merge them beside other operators, per backbone and budget.

Two tables and one figure, from `dpmerge ace-gates` rows (one per weight matrix and task of every release group)
and the merged score files. Every number is computed per seed first, then summarised over seeds by its mean and
two-sided 95 % Student-t interval; DP-Merging - DP is paired by seed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpmerge.epsilon import epsilon_value
from dpmerge.methods import BASELINE, PROPOSED
from dpmerge.report.figures import _pyplot, _require, ordered_methods, save_figure
from dpmerge.report.labels import METHOD_LABELS, label_of, operator_label
from dpmerge.report.small_table import epsilon_text, interval_cell, write_small_table
from dpmerge.report.tables import t_interval

GATE_COLUMNS = {"backbone", "method", "target_epsilon", "seed", "tensor", "task", "gamma", "gate_open",
                "share_above_noise_floor"}
SCORE_COLUMNS = {"backbone", "method", "target_epsilon", "seed", "model", "task", "score"}


def _with_epsilon(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(epsilon=frame["target_epsilon"].map(epsilon_value))


def gate_summary(gates: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, method, epsilon): the share of weight matrices whose gate opens, the median gamma and the
    mean share of a task's covariance above the noise floor, each a mean over seeds with its 95 % interval."""
    _require(gates, GATE_COLUMNS, "ace-gates")
    gates = _with_epsilon(gates)
    keys = ["backbone", "method", "epsilon"]
    matrices = gates.groupby([*keys, "seed", "tensor"], sort=False).agg(
        gamma=("gamma", "first"), gate_open=("gate_open", "first"), floor=("share_above_noise_floor", "mean"))
    per_seed = matrices.groupby(level=[*keys, "seed"], sort=False).agg(
        gate_open=("gate_open", "mean"), gamma=("gamma", "median"), floor=("floor", "mean"),
        matrices=("gamma", "size"))
    rows = []
    for key, group in per_seed.groupby(level=keys, sort=False):
        row = dict(zip(keys, key), seeds=len(group), matrices=int(group["matrices"].iloc[0]))
        for column in ("gate_open", "gamma", "floor"):
            row[column], row[f"{column}_low"], row[f"{column}_high"] = t_interval(group[column])
        rows.append(row)
    frame = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(ordered_methods(frame["method"]))}
    return frame.sort_values(["backbone", "method", "epsilon"], key=lambda c: c.map(order) if c.name == "method"
                             else c, kind="stable").reset_index(drop=True)


def score_summary(scores: pd.DataFrame, operators: list[str], baseline: str = BASELINE,
                  proposed: str = PROPOSED) -> pd.DataFrame:
    """Per (backbone, operator, epsilon): each method's merged score averaged over the backbone's tasks (mean over
    seeds and 95 % interval) and DP-Merging - DP paired by seed; the non-private reference at epsilon inf."""
    _require(scores, SCORE_COLUMNS, "merged scores")
    merged = _with_epsilon(scores[scores["model"].isin(operators)])
    missing = sorted(set(operators) - set(merged["model"]))
    if missing:
        raise ValueError(f"no merged scores of {missing} (present: {sorted(set(scores['model']))})")
    tasks = {b: list(dict.fromkeys(rows["task"])) for b, rows in merged.groupby("backbone", sort=False)}
    averages = merged.pivot_table(index=["backbone", "model", "epsilon", "method", "seed"], columns="task",
                                  values="score", aggfunc="mean", sort=False)
    rows = []
    for (backbone, model, epsilon), group in averages.groupby(level=["backbone", "model", "epsilon"], sort=False):
        per_method = {method: frame[tasks[backbone]].mean(axis=1, skipna=False).droplevel(
            ["backbone", "model", "epsilon", "method"]) for method, frame in group.groupby(level="method")}
        row = {"backbone": backbone, "operator": model, "epsilon": epsilon}
        for method, values in per_method.items():
            row[f"{method}_mean"], row[f"{method}_low"], row[f"{method}_high"] = t_interval(values)
        if baseline in per_method and proposed in per_method:
            paired = (per_method[proposed] - per_method[baseline]).dropna()
            row["difference"], row["difference_low"], row["difference_high"] = t_interval(paired)
            row["seeds"] = len(paired)
        rows.append(row)
    frame = pd.DataFrame(rows)
    order = {name: i for i, name in enumerate(operators)}
    return frame.sort_values(["backbone", "epsilon", "operator"], key=lambda c: c.map(order) if c.name == "operator"
                             else c, kind="stable").reset_index(drop=True)


def write_tables(gates: pd.DataFrame, scores: pd.DataFrame, labels: dict[str, str], prefix: str) -> None:
    """<prefix>_gates.{parquet,md,tex} and <prefix>_scores.{parquet,md,tex}."""
    method = lambda name: label_of(METHOD_LABELS, name)  # noqa: E731

    def gate_cell(column, row):
        if column in ("backbone", "method"):
            return row["backbone"] if column == "backbone" else method(row["method"])
        if column == "epsilon":
            return epsilon_text(row["epsilon"])
        if column in ("gate_open", "floor"):  # shares: an interval past 0 or 100 % is shown at the bound
            low, high = (float(np.clip(100 * row[f"{column}_{end}"], 0, 100)) for end in ("low", "high"))
            return interval_cell(100 * row[column], low, high, 0)
        return f"{row['gamma']:.3g}" if column == "gamma" else str(int(row[column]))

    write_small_table(
        gates, f"{prefix}_gates",
        "ACE's gate on the releases: % of weight matrices with γ above the threshold (adaptive normalisation and "
        "spectral refinement on), median γ, and the % of a task's estimated covariance above the noise floor "
        "(Gavish-Donoho threshold); mean over seeds [95 % t-interval].",
        {"backbone": "Backbone", "method": "Method", "epsilon": "ε", "gate_open": "gate open (%)",
         "gamma": "median γ", "floor": "above noise floor (%)", "matrices": "matrices", "seeds": "seeds"},
        gate_cell, text_columns=3)

    def score_cell(column, row):
        if column == "backbone":
            return row["backbone"]
        if column == "operator":
            return labels.get(row["operator"]) or operator_label(row["operator"])
        if column == "epsilon":
            return epsilon_text(row["epsilon"])
        if column == "difference":
            return interval_cell(row.get("difference"), row.get("difference_low"), row.get("difference_high"),
                             signed=True)
        name = column.removesuffix("_mean")
        return interval_cell(row.get(column), row.get(f"{name}_low"), row.get(f"{name}_high"))

    methods = ordered_methods(c.removesuffix("_mean") for c in scores.columns if c.endswith("_mean"))
    headers = {"backbone": "Backbone", "operator": "Operator", "epsilon": "ε"}
    headers.update({f"{m}_mean": method(m) for m in methods})
    headers["difference"] = f"{method(PROPOSED)} − {method(BASELINE)}"
    write_small_table(
        scores, f"{prefix}_scores",
        "Merged score, averaged over each backbone's tasks, by operator and budget: mean over seeds [95 % "
        "t-interval]; the difference paired by seed (* excludes 0).",
        headers, score_cell, text_columns=3)


def plot_ace_study(gates: pd.DataFrame, scores: pd.DataFrame, labels: dict[str, str], out: list[str]) -> None:
    """Per backbone (columns): top, the share of matrices whose gate opens (solid) and the share of covariance
    above the noise floor (dotted) against epsilon, per method; then each operator's merged score against epsilon
    on DP-Merging releases and on DP releases, the non-private merge at the right edge (epsilon inf, diamonds)."""
    plt = _pyplot()
    backbones = list(dict.fromkeys(gates["backbone"]))
    fig, axes = plt.subplots(3, len(backbones), figsize=(5.4 * len(backbones), 11), squeeze=False)
    finite = sorted({e for e in pd.concat([gates["epsilon"], scores["epsilon"]]) if np.isfinite(e)})
    positions = {e: i for i, e in enumerate(finite)}
    infinity = len(finite)  # the non-private budget, one step right of the largest
    x_of = lambda e: positions[e] if np.isfinite(e) else infinity  # noqa: E731
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^vP*Xh<>"
    for column, backbone in enumerate(backbones):
        top = axes[0][column]
        rows = gates[gates["backbone"] == backbone]
        for index, method in enumerate(ordered_methods(rows["method"])):
            group = rows[rows["method"] == method].sort_values("epsilon")
            x = [x_of(e) for e in group["epsilon"]]
            colour = colours[index % len(colours)]
            name = label_of(METHOD_LABELS, method)
            top.plot(x, 100 * group["gate_open"], "-o", color=colour, label=f"{name}: gate open")
            top.plot(x, 100 * group["floor"], ":s", color=colour, label=f"{name}: above noise floor")
        top.set_ylabel("% of matrices / of covariance")
        top.set_ylim(-3, 103)
        top.set_title(f"{backbone}: what ACE sees")
        rows = scores[scores["backbone"] == backbone]
        for ax, method in ((axes[1][column], PROPOSED), (axes[2][column], BASELINE)):
            for index, (operator, group) in enumerate(rows.groupby("operator", sort=False)):
                group = group.sort_values("epsilon")
                colour, marker = colours[index % len(colours)], markers[index % len(markers)]
                name = labels.get(operator) or operator_label(operator)
                if f"{method}_mean" in group:
                    private = group[group[f"{method}_mean"].notna()]
                    ax.plot([x_of(e) for e in private["epsilon"]], private[f"{method}_mean"], "-", marker=marker,
                            color=colour, label=name)
                if "nonprivate_mean" in group:
                    reference = group[group["nonprivate_mean"].notna()]
                    ax.plot([x_of(e) for e in reference["epsilon"]], reference["nonprivate_mean"], marker, color=colour,
                            markerfacecolor="none")
            ax.set_ylabel("merged score, mean over tasks")
            ax.set_title(f"{backbone}: {label_of(METHOD_LABELS, method)} releases merged")
        for ax in axes[:, column]:
            ax.set_xticks([*range(len(finite)), infinity], labels=[f"{e:g}" for e in finite] + ["∞ (non-private)"])
            ax.set_xlabel("privacy budget ε")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    for path in out:
        save_figure(fig, path)
    plt.close(fig)
