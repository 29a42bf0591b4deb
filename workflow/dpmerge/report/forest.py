"""The answer page's picture: a forest plot of every cell's DP-Merging - DP with its 95 % interval, and beside it
the same merge's margin over the Pretrained row (w0 with a DP head per task), both paired by seed, read from the
Table 1 files (their per-seed columns, report/tables.to_frame)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpmerge.report.figures import _pyplot, _save_all
from dpmerge.report.labels import AVERAGE, METHOD_LABELS
from dpmerge.report.tables import PRETRAINED_ROW, t_interval

AGAINST_DP = "DP-Merging − DP"
AGAINST_PRETRAINED = "DP-Merging − Pretrained"


def _per_seed(table: pd.DataFrame, row: str) -> pd.Series | None:
    """The row's average per seed (index: seed name); its mean alone, as seed 'all', when the file has no
    per-seed columns (one seed)."""
    found = table[table["row"] == row]
    if found.empty:
        return None
    found = found.iloc[0]
    prefix = f"{AVERAGE} seed "
    seeds = {c[len(prefix):]: found[c] for c in table.columns if str(c).startswith(prefix)}
    if not seeds:
        return None if pd.isna(found.get(AVERAGE)) else pd.Series({"all": float(found[AVERAGE])})
    return pd.Series(seeds, dtype=float).dropna()


def _paired(ours: pd.Series | None, theirs: pd.Series | None) -> tuple[float, float, float, int]:
    if ours is None or theirs is None:
        return math.nan, math.nan, math.nan, 0
    both = pd.concat([ours, theirs], axis=1, join="inner").dropna()
    if both.empty:
        return math.nan, math.nan, math.nan, 0
    mean, low, high = t_interval((both.iloc[:, 0] - both.iloc[:, 1]).to_numpy())
    return mean, low, high, len(both)


def forest_rows(tables: dict[str, pd.DataFrame], operators_in) -> pd.DataFrame:
    """One row per (setting, operator, comparison): the paired mean difference of the merged average, its 95 %
    t-interval (NaN below two seeds) and the number of seeds paired."""
    dp, ours = METHOD_LABELS["naive_dp"], METHOD_LABELS["dp_merging"]
    out = []
    for setting, table in tables.items():
        pretrained = _per_seed(table, PRETRAINED_ROW)
        for operator in operators_in(table):
            merged = _per_seed(table, f"{ours} + {operator}")
            for comparison, other in ((AGAINST_DP, _per_seed(table, f"{dp} + {operator}")),
                                      (AGAINST_PRETRAINED, pretrained)):
                mean, low, high, seeds = _paired(merged, other)
                if seeds:
                    out.append({"setting": setting, "operator": operator, "comparison": comparison, "mean": mean,
                                "ci95_low": low, "ci95_high": high, "seeds": seeds})
    return pd.DataFrame(out, columns=["setting", "operator", "comparison", "mean", "ci95_low", "ci95_high", "seeds"])


# Told apart in greyscale by marker and fill, not only by colour
_LOOKS = {AGAINST_DP: dict(marker="o", color="0.0", markerfacecolor="0.0"),
          AGAINST_PRETRAINED: dict(marker="s", color="0.45", markerfacecolor="white")}


def plot_forest(rows: pd.DataFrame, out) -> None:
    """Every (setting, operator) a line, DP-Merging - DP above its margin over the Pretrained row."""
    plt = _pyplot()
    cells = list(dict.fromkeys(zip(rows["setting"], rows["operator"])))
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(cells) + 1.4))
    if not cells:
        ax.text(0.5, 0.5, "No merge of both DP and DP-Merging releases in this study", ha="center", va="center")
        ax.set_axis_off()
        _save_all(fig, out)
        plt.close(fig)
        return
    for comparison, offset in ((AGAINST_DP, -0.14), (AGAINST_PRETRAINED, 0.14)):
        chosen = rows[rows["comparison"] == comparison]
        y = np.array([cells.index((s, o)) for s, o in zip(chosen["setting"], chosen["operator"])]) + offset
        low = (chosen["mean"] - chosen["ci95_low"]).fillna(0).to_numpy()
        high = (chosen["ci95_high"] - chosen["mean"]).fillna(0).to_numpy()
        ax.errorbar(chosen["mean"], y, xerr=[low, high], linestyle="none", capsize=3, label=comparison,
                    **_LOOKS[comparison])
    ax.axvline(0, color="0.3", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(cells)), [f"{setting} · {operator}" for setting, operator in cells])
    ax.invert_yaxis()
    ax.set_xlabel("paired difference in the merged model's average score (points)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    _save_all(fig, out)
    plt.close(fig)
