"""The effective-noise table and figure: merge success of every release group against its effective noise scale T
(diagnostics/noise_scale.py), non-private and private, as learning rate, batch size, weight decay and the budget
move it.

Merge success: the merged model's score minus each task model's own, averaged over tasks (the merge's gain, in
score points, under the study's noise_scale.operator; <= 0 where merging costs), and the loss barrier from each task
model to the weight average (the interpolation diagnostic). A group's T is the geometric mean over its tasks;
the optimum T* is the backbone's non-private setting of largest gain (mean over seeds), and every group's distance
to it is log10(T / T*). The protocol fixed before any run named the normalized merged accuracy (merged / own)
instead; it is kept in the Parquet, but it is undefined where a task model scores near 0, as private MiniLM models
do on the MCC and F1 pair tasks (it ranged from -7950 % to 263 % there), so the gain, read after seeing that, is
what the table and figure show. A setting run at several seeds is shown as its mean over seeds with a 95 %
t-interval; the paired readings are in report/noise_readings.py.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpmerge.report.figures import _pyplot, _save_all
from dpmerge.report.labels import METHOD_LABELS
from dpmerge.report.small_table import write_small_table
from dpmerge.report.tables import t_interval

SETTING = ["backbone", "method", "label", "sweep", "target_epsilon"]
GROUP = SETTING + ["seed"]
SWEEP_NAMES = {"centre": "configured", "lr": "learning rate", "batch_size": "batch size",
               "weight_decay": "weight decay", "epsilon": "epsilon"}
HEADERS = {"backbone": "backbone", "method": "method", "sweep": "varied", "setting": "setting",
           "target_epsilon": "eps", "seeds": "seeds", "noise_multiplier": "sigma", "noise_scale": "T",
           "dp_variance_share": "DP share of noise variance", "noise_share_of_rms": "noise share of Adam's RMS",
           "log10_from_optimum": "log10 T/T*",
           "merged_score": "merged", "individual_score": "own", "merge_gain": "merged − own",
           "merge_gain_interval": "95 % interval", "barrier": "barrier"}
# averaged over seeds with a 95 % t-interval; the rest of a setting's numbers are plain means over its seeds
WITH_INTERVALS = ("merge_gain", "merged_score", "barrier", "log10_from_optimum")


def _geometric_mean(values: pd.Series) -> float:
    values = values.astype(float)
    return float(np.exp(np.log(values).mean())) if (values > 0).all() else math.nan


def group_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per release group and seed from the per-task rows of stages/noise_scale.py, with log10(T / T*)
    against the backbone's non-private setting of largest mean gain over seeds (NaN where no non-private group
    ran) and the setting's name (`setting`: the same for every method, so settings pair across methods)."""
    records = []
    for key, group in rows.groupby(GROUP, sort=True):
        record = dict(zip(GROUP, key))
        record.update({name: float(group[name].iloc[0]) for name in ("lr", "batch_size", "weight_decay")})
        record.update({"steps": int(group["steps"].max()), "noise_multiplier": float(group["noise_multiplier"].mean()),
                       "tasks": int(len(group))})
        for name in ("noise_scale", "noise_scale_dp", "noise_scale_sampling", "effective_lr", "s_dp", "s_sample"):
            # arithmetic where some are 0 (no DP noise in a non-private run): a geometric mean would be NaN
            record[name] = _geometric_mean(group[name]) if (group[name] > 0).all() else float(group[name].mean())
        for name in ("dp_variance_share", "noise_share_of_rms", "decay_factor", "individual_score", "merged_score",
                     "barrier"):
            record[name] = float(group[name].mean())
        record["normalized_merged"] = 100.0 * float(group["normalized_merged"].mean())
        record["merge_gain"] = float((group["merged_score"] - group["individual_score"]).mean())
        records.append(record)
    summary = pd.DataFrame(records)
    summary["setting"] = _setting_names(summary)
    summary["optimum_noise_scale"] = math.nan
    for backbone, group in summary.groupby("backbone"):
        reference = group[group["method"] == "nonprivate"]
        if len(reference):
            means = reference.groupby("setting").agg(gain=("merge_gain", "mean"), noise_scale=("noise_scale",
                                                                                             _geometric_mean))
            best = means.loc[means["gain"].idxmax(), "noise_scale"]
            summary.loc[summary["backbone"] == backbone, "optimum_noise_scale"] = best
    summary["log10_from_optimum"] = np.log10(summary["noise_scale"] / summary["optimum_noise_scale"])
    return summary.sort_values(["backbone", "noise_scale"], ignore_index=True)


def _setting_names(summary: pd.DataFrame) -> list[str]:
    """A learning rate as a multiple of the method's configured one (methods have their own lr), the other
    settings by their value."""
    centre_lr = summary[summary["sweep"] == "centre"].groupby(["backbone", "method"])["lr"].first()
    names = []
    for _, row in summary.iterrows():
        if row["sweep"] == "lr" and (row["backbone"], row["method"]) in centre_lr.index:
            names.append(f"lr × {row['lr'] / centre_lr[(row['backbone'], row['method'])]:.3g}")
        else:
            names.append(setting_text(row))
    return names


def setting_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (release group over its seeds): T and its pieces as geometric means, the measures of
    WITH_INTERVALS as means with 95 % t-intervals over seeds (columns <name>_low, <name>_high), the rest means."""
    records = []
    for key, group in per_seed.groupby(SETTING + ["setting"], sort=True):
        record = dict(zip(SETTING + ["setting"], key))
        record["seeds"] = int(group["seed"].nunique())
        for name in group.columns:
            if name in record or name == "seed" or not pd.api.types.is_numeric_dtype(group[name]):
                continue
            if name in WITH_INTERVALS:
                record[name], record[f"{name}_low"], record[f"{name}_high"] = t_interval(group[name])
            elif name.startswith("noise_scale") or name in ("effective_lr", "s_dp", "s_sample",
                                                              "optimum_noise_scale"):
                record[name] = (_geometric_mean(group[name]) if (group[name] > 0).all()
                                else float(group[name].mean()))
            else:
                record[name] = float(group[name].mean())
        records.append(record)
    return pd.DataFrame(records).sort_values(["backbone", "noise_scale"], ignore_index=True)


def setting_text(row) -> str:
    """What the group changed: the swept hyperparameter's value (the configured run says so)."""
    sweep = row["sweep"]
    if sweep == "centre":
        return "as configured"
    if sweep == "epsilon":
        return f"eps {row['target_epsilon']:g}"
    short = {"lr": "lr", "batch_size": "B", "weight_decay": "wd"}[sweep]
    return f"{short} {row[sweep]:g}"


def _cell(column: str, row) -> str:
    if column == "merge_gain_interval":
        low, high = row.get("merge_gain_low", math.nan), row.get("merge_gain_high", math.nan)
        return "--" if math.isnan(low) else f"[{low:+.1f}, {high:+.1f}]"
    value = row[column]
    if column == "method":
        return METHOD_LABELS.get(value, value)
    if column == "sweep":
        return SWEEP_NAMES.get(value, value)
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "--"
    if column == "target_epsilon":
        return "inf" if math.isinf(value) else f"{value:g}"
    if column in ("noise_scale",):
        return f"{value:.2e}"
    if column in ("noise_multiplier", "dp_variance_share", "noise_share_of_rms", "barrier"):
        return f"{value:.3f}"
    if column == "log10_from_optimum":
        return f"{value:+.2f}"
    if column == "merge_gain":
        return f"{value:+.1f}"
    if column == "seeds":
        return f"{int(value)}"
    return f"{value:.1f}"


def write_noise_table(settings: pd.DataFrame, prefix: str) -> None:
    """The table of `setting_summary` rows."""
    caption = ("Effective noise scale T = lr x D x s^2 / sqrt(g^2 + s^2), s^2 = s_sample^2 + s_dp^2, of each release "
               "group (geometric mean over tasks and seeds; s_dp = sigma C / B is DP's injected noise, g the mean "
               "gradient, D AdamW's decay growth) beside its merge success: the merged score minus each task "
               "model's own (mean over tasks and seeds, score points, with its 95 % t-interval over seeds) and the "
               "loss barrier to the weight average; T* is the backbone's non-private setting of largest mean gain.")
    write_small_table(settings, prefix, caption, HEADERS, _cell, text_columns=4)


def plot_noise_scale(summary: pd.DataFrame, out: list[str]) -> None:
    """Per backbone: the merge's gain over the task models (top) and barrier (bottom) against T, log scale; one
    colour per method, one marker per varied hyperparameter, each sweep's points joined through the configured
    run; with `setting_summary` rows, bars are 95 % intervals over seeds."""
    plt = _pyplot()
    backbones = sorted(set(summary["backbone"]))
    fig, axes = plt.subplots(2, len(backbones), figsize=(5.2 * len(backbones), 8.0), squeeze=False, sharex="col")
    colours = {"nonprivate": "tab:blue", "naive_dp": "tab:red", "dp_merging": "tab:green"}
    markers = {"centre": "o", "lr": "s", "batch_size": "^", "weight_decay": "D", "epsilon": "*"}
    others = iter(["tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"])
    for column, backbone in enumerate(backbones):
        chosen = summary[summary["backbone"] == backbone]
        for method in sorted(set(chosen["method"])):
            colour = colours.get(method) or colours.setdefault(method, next(others, "0.4"))
            mine = chosen[chosen["method"] == method]
            centre = mine[mine["sweep"] == "centre"]
            for sweep in markers:
                points = mine[mine["sweep"] == sweep]
                if sweep != "centre" and len(points):
                    points = pd.concat([points, centre]).sort_values("noise_scale")
                for row_index, measure in enumerate(("merge_gain", "barrier")):
                    ax = axes[row_index][column]
                    if not len(points):
                        continue
                    ax.plot(points["noise_scale"], points[measure], color=colour, alpha=0.35, linewidth=1)
                    if f"{measure}_low" in points and points[f"{measure}_low"].notna().any():
                        spread = [points[measure] - points[f"{measure}_low"],
                                  points[f"{measure}_high"] - points[measure]]
                        ax.errorbar(points["noise_scale"], points[measure], yerr=np.nan_to_num(spread), fmt="none",
                                    ecolor=colour, alpha=0.5, linewidth=1, capsize=2)
                    ax.scatter(points["noise_scale"], points[measure], color=colour, marker=markers[sweep], s=36,
                               zorder=3, label=(f"{METHOD_LABELS.get(method, method)}: {SWEEP_NAMES[sweep]}"
                                                if row_index == 0 else None))
        optimum = chosen["optimum_noise_scale"].dropna()
        for row_index, ylabel in enumerate(("merged − own model, mean over tasks (points)",
                                            "loss barrier to the weight average")):
            ax = axes[row_index][column]
            if len(optimum):
                ax.axvline(float(optimum.iloc[0]), color="0.5", linestyle=":", linewidth=1)
            ax.set_xscale("log")
            ax.set(ylabel=ylabel)
            if row_index == 0:
                ax.set_title(f"{backbone} (dotted: T* of the best non-private setting)")
            else:
                ax.set_xlabel("effective noise scale T (log scale)")
    # one legend for every panel, below them, where it hides no point
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    _save_all(fig, out)
    plt.close(fig)
