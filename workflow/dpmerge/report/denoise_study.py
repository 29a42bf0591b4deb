"""Denoised private releases: does denoising naive-DP releases (post-processing, no new budget) recover what
DP-Merging gains, and does any denoised merge beat the Pretrained row?

From the merged score files of every studied pair of merge entries (one denoising its inputs, its twin not), the
Pretrained row's individual scores and the denoised releases' metadata (what denoising found). Every number is
computed per seed first (a merged score is the mean over the backbone's tasks), then summarised over seeds by its
mean and two-sided 95 % Student-t interval; every difference is paired by seed. The readings, fixed before the
study ran (presets/denoise.yaml), are the five differences of `DIFFERENCES`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpmerge.epsilon import epsilon_value
from dpmerge.methods import BASELINE, METHODS, PROPOSED
from dpmerge.report.figures import _pyplot, _require, save_figure
from dpmerge.report.labels import operator_label
from dpmerge.report.small_table import epsilon_text, interval_cell, write_small_table
from dpmerge.report.tables import t_interval

SCORE_COLUMNS = {"backbone", "method", "target_epsilon", "seed", "model", "task", "score"}
# The columns of the score table: (method, denoised?) and the Pretrained row
ARMS = {"dp": (BASELINE, False), "dp_denoised": (BASELINE, True), "dpm": (PROPOSED, False),
        "dpm_denoised": (PROPOSED, True)}
# (name, minuend, subtrahend): each read paired by seed
DIFFERENCES = (
    ("denoise_gain_dp", "dp_denoised", "dp"),  # does denoising help naive-DP releases?
    ("dp_denoised_vs_dpm", "dp_denoised", "dpm"),  # does it recover what DP-Merging gains?
    ("denoise_gain_dpm", "dpm_denoised", "dpm"),  # does it help DP-Merging's releases too?
    ("dp_denoised_vs_pretrained", "dp_denoised", "pretrained"),  # does any denoised merge beat w0 + heads?
    ("dpm_denoised_vs_pretrained", "dpm_denoised", "pretrained"),
)


def _label(method: str) -> str:
    return METHODS[method].label


ARM_LABELS = {"dp": _label(BASELINE), "dp_denoised": f"{_label(BASELINE)} + denoise", "dpm": _label(PROPOSED),
              "dpm_denoised": f"{_label(PROPOSED)} + denoise", "pretrained": "Pretrained"}


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """{'denoised entry': 'plain entry'} from 'denoised=plain' strings."""
    parsed = {}
    for pair in pairs:
        denoised, sep, plain = pair.partition("=")
        if not sep or not denoised or not plain:
            raise ValueError(f"--pairs: expected DENOISED=PLAIN (two merge entries), got {pair!r}")
        parsed[denoised] = plain
    return parsed


def _per_seed_means(scores: pd.DataFrame) -> pd.Series:
    """Mean over each backbone's tasks per (backbone, model, epsilon, method, seed); NaN where a task is missing."""
    tasks = {b: sorted(set(rows["task"])) for b, rows in scores.groupby("backbone")}
    wide = scores.pivot_table(index=["backbone", "model", "epsilon", "method", "seed"], columns="task",
                              values="score", aggfunc="mean")
    return pd.concat([rows[tasks[b]].mean(axis=1, skipna=False)
                      for b, rows in wide.groupby(level="backbone")])


def _seeds(series: pd.Series, **levels) -> pd.Series:
    """The values of `series` at the given index levels, indexed by seed alone."""
    mask = np.ones(len(series), dtype=bool)
    for level, value in levels.items():
        mask &= series.index.get_level_values(level) == value
    return pd.Series(series[mask].to_numpy(), index=series[mask].index.get_level_values("seed"))


def score_summary(scores: pd.DataFrame, pretrained: pd.DataFrame | None, pairs: dict[str, str]) -> pd.DataFrame:
    """Per (backbone, plain entry, epsilon): each arm's merged score (mean over seeds, 95 % interval), the
    Pretrained row's, and the differences of DIFFERENCES paired by seed."""
    _require(scores, SCORE_COLUMNS, "merged scores")
    wanted = set(pairs) | set(pairs.values())
    scores = scores[scores["model"].isin(wanted) & scores["method"].isin([BASELINE, PROPOSED])]
    missing = sorted(wanted - set(scores["model"]))
    if missing:
        raise ValueError(f"no merged scores of {missing} for {BASELINE} or {PROPOSED}")
    means = _per_seed_means(scores.assign(epsilon=scores["target_epsilon"].map(epsilon_value)))
    reference = None
    if pretrained is not None and len(pretrained):
        _require(pretrained, SCORE_COLUMNS, "Pretrained row's scores")
        own = pretrained[pretrained["model"] == "individual"]
        if "source_task" in own:
            own = own[own["source_task"] == own["task"]]
        reference = _per_seed_means(own.assign(epsilon=own["target_epsilon"].map(epsilon_value)))
    rows = []
    for denoised, plain in pairs.items():
        for backbone, epsilon in sorted(set(zip(means.index.get_level_values("backbone"),
                                                means.index.get_level_values("epsilon")))):
            per_seed = {arm: _seeds(means, backbone=backbone, model=denoised if is_denoised else plain,
                                    epsilon=epsilon, method=method)
                        for arm, (method, is_denoised) in ARMS.items()}
            if reference is not None:
                per_seed["pretrained"] = _seeds(reference, backbone=backbone, epsilon=epsilon)
            row = {"backbone": backbone, "operator": plain, "denoised_entry": denoised, "epsilon": epsilon}
            for arm, values in per_seed.items():
                row[f"{arm}_mean"], row[f"{arm}_low"], row[f"{arm}_high"] = t_interval(values)
            for name, left, right in DIFFERENCES:
                if left in per_seed and right in per_seed:
                    paired = (per_seed[left] - per_seed[right]).dropna()
                    row[name], row[f"{name}_low"], row[f"{name}_high"] = t_interval(paired)
                    row[f"{name}_seeds"] = len(paired)
            rows.append(row)
    order = {name: i for i, name in enumerate(pairs.values())}
    return pd.DataFrame(rows).sort_values(["backbone", "operator", "epsilon"], key=lambda c: c.map(order)
                                          if c.name == "operator" else c, kind="stable").reset_index(drop=True)


def noise_summary(records: list[dict]) -> pd.DataFrame:
    """Per (backbone, method, epsilon, denoiser): what denoising found in the releases, over tasks and seeds:
    the pooled noise level, the share of weight matrices with any direction above the noise floor, the share of
    the matrices' squared norm kept, and the James-Stein factor's mean on the other tensors."""
    rows = []
    for meta in records:
        found = meta.get("denoised")
        if not found:
            raise ValueError(f"a denoised vector of {meta.get('task')} lacks its 'denoised' metadata")
        spectral = [r for r in found["tensors"].values() if r["how"] == "spectral"]
        others = [r for r in found["tensors"].values() if r["how"] != "spectral" and r["kept_energy"] is not None]
        rows.append({"backbone": meta.get("backbone"), "method": meta.get("method"),
                     "epsilon": epsilon_value(meta.get("target_epsilon")), "denoiser": found["method"],
                     "seed": meta.get("seed"), "task": meta.get("task"),
                     "noise_level": found["pooled_noise_level"],
                     "matrices_kept": np.mean([r["kept_rank"] > 0 for r in spectral]) if spectral else math.nan,
                     "energy_kept": np.mean([r["kept_energy"] for r in spectral if r["kept_energy"] is not None])
                     if spectral else math.nan,
                     "vector_factor": np.mean([math.sqrt(r["kept_energy"]) for r in others]) if others else math.nan})
    frame = pd.DataFrame(rows)
    keys = ["backbone", "method", "epsilon", "denoiser"]
    per_seed = frame.groupby([*keys, "seed"]).agg(
        noise_level=("noise_level", "mean"), matrices_kept=("matrices_kept", "mean"),
        energy_kept=("energy_kept", "mean"), vector_factor=("vector_factor", "mean"), tasks=("task", "nunique"))
    out = []
    for key, group in per_seed.groupby(level=keys):
        row = dict(zip(keys, key), seeds=len(group), tasks=int(group["tasks"].max()))
        for column in ("noise_level", "matrices_kept", "energy_kept", "vector_factor"):
            row[column], row[f"{column}_low"], row[f"{column}_high"] = t_interval(group[column])
        out.append(row)
    return pd.DataFrame(out)


DIFFERENCE_HEADERS = {
    "denoise_gain_dp": "(a) DP + denoise − DP",
    "dp_denoised_vs_dpm": "(b) DP + denoise − DP-Merging",
    "denoise_gain_dpm": "(c) DP-Merging + denoise − DP-Merging",
    "dp_denoised_vs_pretrained": "(d) DP + denoise − Pretrained",
    "dpm_denoised_vs_pretrained": "(d) DP-Merging + denoise − Pretrained",
}


def write_tables(scores: pd.DataFrame, noise: pd.DataFrame, prefix: str) -> None:
    """PREFIX.{parquet,md,tex} (the merged scores and the readings) and PREFIX_noise.* (what denoising found)."""

    def score_cell(column, row):
        if column == "backbone":
            return row["backbone"]
        if column == "operator":
            return operator_label(row["operator"])
        if column == "epsilon":
            return epsilon_text(row["epsilon"])
        if column in DIFFERENCE_HEADERS:
            return interval_cell(row.get(column), row.get(f"{column}_low"), row.get(f"{column}_high"), signed=True)
        name = column.removesuffix("_mean")
        return interval_cell(row.get(column), row.get(f"{name}_low"), row.get(f"{name}_high"))

    headers = {"backbone": "Backbone", "operator": "Operator", "epsilon": "ε"}
    headers.update({f"{arm}_mean": label for arm, label in ARM_LABELS.items() if f"{arm}_mean" in scores})
    headers.update({name: text for name, text in DIFFERENCE_HEADERS.items() if name in scores})
    write_small_table(
        scores, prefix,
        "Merged score of released task vectors as released and denoised (post-processing, no new budget), "
        "averaged over each backbone's tasks: mean over seeds [95 % t-interval]; the Pretrained row is w0 with a "
        "DP head per task; differences paired by seed (* excludes 0).",
        headers, score_cell, text_columns=3)

    def noise_cell(column, row):
        if column in ("backbone", "denoiser"):
            return str(row[column])
        if column == "method":
            return _label(row["method"])
        if column == "epsilon":
            return epsilon_text(row["epsilon"])
        if column == "noise_level":
            return f"{row['noise_level']:.3g}"
        if column in ("matrices_kept", "energy_kept", "vector_factor"):
            low, high = (float(np.clip(100 * row[f"{column}_{end}"], 0, 100)) for end in ("low", "high"))
            return interval_cell(100 * row[column], low, high, 0 if column == "matrices_kept" else 2)
        return str(int(row[column]))

    write_small_table(
        noise, f"{prefix}_noise",
        "What denoising found in the releases: the noise level estimated from them (Marchenko-Pastur median), the "
        "% of weight matrices with any direction above the noise floor, the % of the matrices' squared norm kept, "
        "and the % of the other tensors kept by James-Stein; mean over seeds of the mean over tasks [95 % "
        "t-interval].",
        {"backbone": "Backbone", "method": "Method", "epsilon": "ε", "denoiser": "Denoiser",
         "noise_level": "noise level", "matrices_kept": "matrices with signal (%)", "energy_kept": "energy kept (%)",
         "vector_factor": "vectors kept (%)", "seeds": "seeds", "tasks": "tasks"},
        noise_cell, text_columns=4)


def plot_denoise_study(scores: pd.DataFrame, out: list[str]) -> None:
    """Backbones as rows, operators as columns: each arm's merged score against epsilon with its 95 % interval,
    the Pretrained row dashed."""
    plt = _pyplot()
    backbones = list(dict.fromkeys(scores["backbone"]))
    operators = list(dict.fromkeys(scores["operator"]))
    fig, axes = plt.subplots(len(backbones), len(operators), figsize=(4.2 * len(operators), 3.6 * len(backbones)),
                             squeeze=False, sharey="row")
    styles = {"dp": ("C3", "-", "o"), "dp_denoised": ("C3", "--", "s"), "dpm": ("C0", "-", "o"),
              "dpm_denoised": ("C0", "--", "s"), "pretrained": ("0.4", ":", "D")}
    for row, backbone in enumerate(backbones):
        for column, operator in enumerate(operators):
            ax = axes[row][column]
            rows = scores[(scores["backbone"] == backbone) & (scores["operator"] == operator)].sort_values("epsilon")
            x = np.arange(len(rows))
            for arm, (colour, line, marker) in styles.items():
                if f"{arm}_mean" not in rows:
                    continue
                mean = rows[f"{arm}_mean"].to_numpy(float)
                low, high = rows[f"{arm}_low"].to_numpy(float), rows[f"{arm}_high"].to_numpy(float)
                ax.plot(x, mean, linestyle=line, marker=marker, color=colour, label=ARM_LABELS[arm])
                if np.isfinite(low).any():
                    ax.fill_between(x, low, high, color=colour, alpha=0.12, linewidth=0)
            ax.set_xticks(x, labels=[epsilon_text(e) for e in rows["epsilon"]])
            ax.set_xlabel("privacy budget ε")
            ax.set_ylabel("merged score, mean over tasks")
            ax.set_title(f"{backbone}: {operator_label(operator)}")
            ax.grid(alpha=0.3)
            if row == 0 and column == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    for path in out:
        save_figure(fig, path)
    plt.close(fig)
