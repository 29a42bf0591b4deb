"""The effective-noise study's readings, fixed in presets/noise_scale.yaml before its seeds 1 and 2 ran, each a mean
over seeds with a 95 % Student-t interval over seeds (every release group and seed is an independent run):

(a) distance from the optimum: a private method's log10 T/T*, at its configured run and averaged over its settings;
(b) DP-Merging - DP: the merge's gain (merged - own) and the merged score, paired by seed, per setting and averaged
    over the settings both ran;
(c) ordering: within each method, Spearman's rho over its settings between log T and the gain (and the merged
    score), computed per seed.

Then, exploratory (named so, not fixed beforehand): every setting's gain minus its method's configured run's,
paired by seed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpmerge.report.labels import METHOD_LABELS
from dpmerge.report.small_table import write_small_table
from dpmerge.report.tables import t_interval

HEADERS = {"backbone": "backbone", "reading": "reading", "subject": "compared", "setting": "setting",
           "estimate": "mean", "interval": "95 % interval", "seeds": "seeds"}


def _label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def _row(backbone, reading, subject, setting, values, bounds=(-math.inf, math.inf)) -> dict:
    estimate, low, high = t_interval(values)
    low, high = (low if math.isnan(low) else max(low, bounds[0])), (high if math.isnan(high) else min(high, bounds[1]))
    return {"backbone": backbone, "reading": reading, "subject": subject, "setting": setting, "estimate": estimate,
            "low": low, "high": high, "seeds": int(np.sum(~np.isnan(np.asarray(values, dtype=float))))}


def _pivot(chosen: pd.DataFrame, column: str) -> pd.DataFrame:
    """settings x seeds of one method's `column`."""
    return chosen.pivot_table(index="setting", columns="seed", values=column, aggfunc="first")


def _spearman_per_seed(chosen: pd.DataFrame, column: str) -> list[float]:
    from scipy.stats import spearmanr

    values = []
    for _, seed_rows in chosen.groupby("seed"):
        if len(seed_rows) >= 3 and seed_rows[column].nunique() > 1:
            values.append(float(spearmanr(np.log10(seed_rows["noise_scale"]), seed_rows[column]).statistic))
    return values


def noise_readings(per_seed: pd.DataFrame, private_pair: tuple[str, str] = ("dp_merging", "naive_dp")) -> pd.DataFrame:
    """The readings above from `report.noise_scale.group_summary` rows (one per release group and seed)."""
    rows = []
    ours, theirs = private_pair
    for backbone, mine in per_seed.groupby("backbone", sort=True):
        methods = sorted(set(mine["method"]))
        for method in methods:
            chosen = mine[mine["method"] == method]
            if method != "nonprivate" and chosen["log10_from_optimum"].notna().any():
                distance = _pivot(chosen, "log10_from_optimum")
                if "as configured" in distance.index:
                    rows.append(_row(backbone, "(a) log10 T/T*", _label(method), "as configured",
                                     distance.loc["as configured"].to_numpy()))
                rows.append(_row(backbone, "(a) log10 T/T*", _label(method), "mean over its settings",
                                 distance.mean(axis=0).to_numpy()))
        if ours in methods and theirs in methods:
            subject = f"{_label(ours)} − {_label(theirs)}"
            for column, reading in (("merge_gain", "(b) merged − own"), ("merged_score", "(b) merged")):
                difference = (_pivot(mine[mine["method"] == ours], column)
                              - _pivot(mine[mine["method"] == theirs], column)).dropna(how="all")
                if len(difference):
                    rows.append(_row(backbone, reading, subject, f"mean over {len(difference)} settings",
                                     difference.mean(axis=0).to_numpy()))
                if column == "merge_gain":
                    rows += [_row(backbone, reading, subject, setting, difference.loc[setting].to_numpy())
                             for setting in difference.index]
        for method in methods:
            chosen = mine[mine["method"] == method]
            for column, what in (("merge_gain", "merged − own"), ("merged_score", "merged")):
                rho = _spearman_per_seed(chosen, column)
                if rho:
                    # a t-interval knows nothing of rho's range: cut at +-1
                    rows.append(_row(backbone, f"(c) Spearman ρ(log T, {what})", _label(method),
                                     f"over {chosen['setting'].nunique()} settings", rho, bounds=(-1.0, 1.0)))
        for method in methods:
            gains = _pivot(mine[mine["method"] == method], "merge_gain")
            if "as configured" not in gains.index:
                continue
            rows += [_row(backbone, "exploratory: merged − own, setting − configured", _label(method), setting,
                          (gains.loc[setting] - gains.loc["as configured"]).to_numpy())
                     for setting in gains.index if setting != "as configured"]
    return pd.DataFrame(rows, columns=[c for c in HEADERS if c != "interval"] + ["low", "high"])


def _cell(column: str, row) -> str:
    if column == "interval":
        return "--" if math.isnan(row["low"]) else f"[{row['low']:+.2f}, {row['high']:+.2f}]"
    value = row[column]
    if isinstance(value, str):
        return value
    if column == "seeds":
        return f"{int(value)}"
    return "--" if math.isnan(value) else f"{value:+.2f}"


def write_readings_table(readings: pd.DataFrame, prefix: str) -> None:
    caption = ("Readings of the effective-noise study fixed before seeds 1-2 ran: (a) how far each private method's "
               "T lies above the non-private optimum T* (decades), (b) DP-Merging minus DP in the merge's gain and "
               "merged score (score points, paired by seed), (c) Spearman's rho between log T and merge success "
               "over a method's settings (per seed); then every setting's gain minus its configured run's "
               "(exploratory). Mean over seeds and its 95 % t-interval over seeds.")
    write_small_table(readings, prefix, caption, HEADERS, _cell, text_columns=4)
