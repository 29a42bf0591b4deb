"""Paper-shaped tables (Parquet + Markdown + LaTeX) from evaluation files: mean +- std over seeds, and each
difference with its paired 95 % t-interval.

Every builder is a pure function of a score frame (the concatenated score Parquet files: backbone, method,
target_epsilon, seed, model, source_task, task, score, metric, and for newer files rho and anchor_lambda) and
returns a `PaperTable`. Each cell is computed per seed first (a task's score; the average over tasks; an
improvement as the paired difference proposed - baseline of the same seed), then summarised by its mean and
sample standard deviation (ddof=1) over seeds.

- Table 1 (paper Sec. 6.2; Tables 3/11 with `metric_in_header`): `table1`
- Table 4 (Sec. 6.3, privacy budgets): `table_epsilon_sweep`
- Table 5 (Sec. 6.4, ablation): `table_ablation`
- Tables 6/7 (sensitivity to rho / lambda): `table_sensitivity`
- Table 8 (robustness to merging operators): `table_operators`
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.artifacts import atomic_write
from dpmerge.epsilon import epsilon_value
from dpmerge.methods import ABLATIONS, BASELINE, PROPOSED
from dpmerge.report.labels import (
    ABLATION_ROWS,
    AVERAGE,
    AVERAGE_GAIN,
    METHOD_LABELS,
    NORMALIZED,
    SENSITIVITY_SYMBOLS,
    label_of,
    operator_label,
)


@dataclass(frozen=True)
class PaperTable:
    """A table of means over seeds with their sample standard deviations.

    mean: index = row labels, columns = the table's columns.
    std: the same shape, ddof=1 (NaN in a cell with one seed); None when no cell has more than one seed.
    seeds: per row, the number of seeds behind it (the largest count over its cells).
    stub: the header of the row-label column in Markdown and LaTeX.
    Cells of a row whose label starts with 'improvement', or of a column whose label contains 'improvement',
    are differences: printed with a sign and, from two seeds on, with their 95 % interval.
    """
    mean: pd.DataFrame
    std: pd.DataFrame | None
    seeds: pd.Series
    stub: str = field(default="Method")
    # Two-sided 95 % Student-t interval of each cell's mean (NaN below two seeds); None when no cell has two.
    # For a difference row or column the per-seed values are paired differences, so this is the paired interval.
    low: pd.DataFrame | None = None
    high: pd.DataFrame | None = None
    # Long frame (row, column, seed, value): every per-seed value behind the means, kept in the Parquet file.
    per_seed: pd.DataFrame | None = None
    # Sentences printed under the table (e.g. why a column is blank)
    notes: tuple[str, ...] = ()

    def renamed(self, columns: dict) -> "PaperTable":
        """The same table with columns renamed (e.g. 'task' -> 'task (metric)')."""
        def rename(frame):
            return None if frame is None else frame.rename(columns=columns)

        per_seed = None if self.per_seed is None else self.per_seed.assign(
            column=self.per_seed["column"].map(lambda c: columns.get(c, c)))
        return PaperTable(rename(self.mean), rename(self.std), self.seeds, self.stub, rename(self.low),
                          rename(self.high), per_seed, self.notes)


def _summarise(per_seed: dict[str, pd.DataFrame], columns: list[str], stub: str = "Method") -> PaperTable:
    """PaperTable from each row's seed x column values (NaN = no value for that seed)."""
    labels = list(per_seed)
    values = {label: frame.reindex(columns=columns).astype(float) for label, frame in per_seed.items()}
    mean = pd.DataFrame([values[r].mean() for r in labels], index=labels, columns=columns, dtype=float)
    std = pd.DataFrame([values[r].std(ddof=1) for r in labels], index=labels, columns=columns, dtype=float)
    seeds = pd.Series([int(values[r].notna().sum().max()) for r in labels], index=labels, dtype="int64",
                      name="seeds")
    count = pd.DataFrame([values[r].notna().sum() for r in labels], index=labels, columns=columns, dtype=float)
    half = student_t_quantile(count - 1) * std / np.sqrt(count)
    low, high = mean - half, mean + half
    per_seed = pd.concat(
        [values[r].rename_axis(index="seed", columns="column").stack().rename("value").reset_index().assign(row=r)
         for r in labels] or [pd.DataFrame(columns=["seed", "column", "value", "row"])], ignore_index=True)
    per_seed = per_seed[["row", "column", "seed", "value"]].assign(seed=per_seed["seed"].map(_seed_name))
    for frame in (mean, std, seeds, low, high):
        frame.index.name = "row"
    no_spread = std.isna().all().all()
    return PaperTable(mean, None if no_spread else std, seeds, stub, None if no_spread else low,
                      None if no_spread else high, per_seed)


def _seed_name(seed) -> str:
    """A seed as a column suffix: 0 and 0.0 are both '0'."""
    if isinstance(seed, (int, float, np.integer, np.floating)) and float(seed).is_integer():
        return str(int(seed))
    return str(seed)


def t_interval(values) -> tuple[float, float, float]:
    """Mean of `values` and its two-sided 95 % Student-t interval (NaN bounds below two values)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    from scipy.stats import t

    half = float(t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def student_t_quantile(degrees_of_freedom: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """The two-sided `level` quantile of Student's t per cell (NaN below one degree of freedom)."""
    from scipy.stats import t as student_t

    dof = degrees_of_freedom.where(degrees_of_freedom >= 1)
    return dof.apply(lambda column: pd.Series(student_t.ppf(0.5 + level / 2, column), index=column.index))


def _require_columns(scores: pd.DataFrame, needed: set[str], what: str) -> None:
    if missing := needed - set(scores.columns):
        raise ValueError(f"{what}: score table lacks columns {sorted(missing)}")


def _with_seed(scores: pd.DataFrame) -> pd.DataFrame:
    """A seed column for every row: a frame (or rows) without one counts as one seed."""
    seed = scores["seed"] if "seed" in scores.columns else pd.Series(np.nan, index=scores.index)
    return scores.assign(seed=seed.astype(object).where(seed.notna(), "unseeded"))


def _own_tasks(scores: pd.DataFrame) -> pd.DataFrame:
    """Individual models count on their own task only; merged rows all count."""
    if "source_task" not in scores.columns:
        return scores
    return scores[(scores["model"] != "individual") | (scores["source_task"] == scores["task"])]


def _per_seed_tasks(rows: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """seed x (tasks + 'Avg.'): each task's score per seed and the seed's average over all `tasks` (NaN for a
    seed that lacks one of them, so an average never mixes task sets)."""
    wide = rows.pivot_table(index="seed", columns="task", values="score", aggfunc="mean", sort=False)
    wide = wide.reindex(columns=tasks)
    wide[AVERAGE] = wide[tasks].mean(axis=1, skipna=False)
    return wide


def _seed_average(rows: pd.DataFrame, tasks: list[str]) -> pd.Series:
    """Per seed, the average score over `tasks` (NaN for a seed lacking one)."""
    return _per_seed_tasks(rows, tasks)[AVERAGE]


def _one_setting(rows: pd.DataFrame, what: str) -> None:
    """Refuse to average over several backbones or several finite privacy budgets."""
    if "backbone" in rows.columns and rows["backbone"].nunique() > 1:
        raise ValueError(f"{what}: scores mix backbones {sorted(rows['backbone'].unique())}; pass one backbone's")
    if "target_epsilon" in rows.columns:
        budgets = {e for e in map(epsilon_value, rows["target_epsilon"]) if math.isfinite(e)}
        if len(budgets) > 1:
            raise ValueError(f"{what}: scores mix privacy budgets {sorted(budgets)}; pass one epsilon's")


PRETRAINED_ROW = "Pretrained (w0, a head per task)"


def table1(scores: pd.DataFrame, baseline: str = BASELINE, proposed: str = PROPOSED,
           metric_in_header: bool = False) -> PaperTable:
    """Table 1 (and the GLUE Tables 3/11): rows = row labels, columns = tasks + 'Avg.'.

    Rows: the individual models (own task only) of each method present, then per merge operator the
    non-private reference, `baseline` + operator, `proposed` + operator, their improvement (paired per seed)
    and the ablations' rows (dp_sam = w/o alignment, dp_anchor = w/o flatness) when such runs are present.
    Beside the average, a merged row's normalized average (`_with_normalized`: merged / individual, in %).
    With `metric_in_header` a column reads 'task (metric)' from the frame's metric column, as GLUE tables do.
    """
    _require_columns(scores, {"model", "method", "task", "score"}, "Table 1")
    scores = _with_seed(_own_tasks(scores))
    tasks = list(dict.fromkeys(scores["task"]))
    groups = {key: rows for key, rows in scores.groupby(["model", "method"], sort=False)}
    chance = _chance_levels(scores, tasks)
    notes: dict[str, str] = {}

    def per_seed(model: str, method: str) -> pd.DataFrame | None:
        return _per_seed_tasks(groups[(model, method)], tasks) if (model, method) in groups else None

    def merged(operator: str, method: str) -> pd.DataFrame | None:
        rows = per_seed(operator, method)
        if rows is None:
            return None
        normalized, why = _with_normalized(rows, per_seed("individual", method), tasks, chance)
        if why and chance is None:
            notes.setdefault("", f"{NORMALIZED} is blank: {why}.")
        elif why:
            notes.setdefault(method, f"{NORMALIZED} is blank for {label_of(METHOD_LABELS, method)}'s merges: {why}.")
        return normalized

    rows: dict[str, pd.DataFrame] = {}
    # w0 with a DP head per task (CLIP: zero-shot heads): what a merge must beat to be worth doing
    if (r := per_seed("individual", "pretrained_head")) is not None:
        rows[PRETRAINED_ROW] = r
    for method in ("nonprivate", baseline, proposed, *ABLATIONS):
        if (r := per_seed("individual", method)) is not None:
            rows[f"{label_of(METHOD_LABELS, method)} Individual"] = r
    for operator in [m for m in dict.fromkeys(scores["model"]) if m != "individual"]:
        op = operator_label(operator)
        base, ours = merged(operator, baseline), merged(operator, proposed)
        if (reference := merged(operator, "nonprivate")) is not None:
            rows[f"{label_of(METHOD_LABELS, 'nonprivate')} + {op}"] = reference
        if base is not None:
            rows[f"{label_of(METHOD_LABELS, baseline)} + {op}"] = base
        if ours is not None:
            rows[f"{label_of(METHOD_LABELS, proposed)} + {op}"] = _with_average_gain(ours, base)
        if base is not None and ours is not None:
            rows[f"  improvement ({op})"] = ours - base  # aligned on seed: paired differences
        for ablation in ABLATIONS:  # paper Table 5's rows, when those runs exist
            if (r := merged(operator, ablation)) is not None:
                rows[f"{label_of(METHOD_LABELS, ablation)} + {op}"] = _with_average_gain(r, base)
    table = _summarise(rows, tasks + [AVERAGE, NORMALIZED, AVERAGE_GAIN])
    if chance is not None and (table.mean[NORMALIZED].notna().any() or notes):
        notes = {"definition": NORMALIZED_NOTE, **notes}
    table = replace(table, notes=tuple(notes.values()))
    return _with_metric_headers(table, scores) if metric_in_header else table


# How far above chance an individual model must lie (by its interval's lower end, or its score with one seed),
# as a share of the way from chance to 100, before a merge is normalized by it: a ratio to a gap near 0 is noise
NORMALIZED_MIN_SHARE = 0.1
NORMALIZED_NOTE = (f"{NORMALIZED}: per task 100 × (merged − chance) / (individual − chance), chance being the "
                   "task's chance level under its metric and individual the same method's individual models' mean "
                   "over seeds, averaged over the tasks.")


def _chance_levels(scores: pd.DataFrame, tasks: list[str]) -> pd.Series | None:
    """Each task's chance level (metrics.chance_level, recorded in every score row); None when the score files
    predate it or disagree."""
    if "chance" not in scores.columns:
        return None
    levels = scores.dropna(subset=["chance"]).groupby("task")["chance"].agg(["min", "max"])
    if levels.empty or not (levels["max"] - levels["min"] < 1e-9).all():
        return None
    return levels["min"].reindex(tasks)


def _with_normalized(merged: pd.DataFrame, individual: pd.DataFrame | None, tasks: list[str],
                     chance: pd.Series | None) -> tuple[pd.DataFrame, str | None]:
    """The merging literature's normalized score, measured from chance: per seed, the mean over tasks of
    100 x (merged - chance) / (individual - chance), where individual is the same method's individual models'
    mean over seeds (one number per task, so one unlucky seed does not blow a ratio up). Blank, with the reason
    returned, where the individual run is missing, where the score files carry no chance level, and where some
    task's individual models do not lie clearly above chance (NORMALIZED_MIN_SHARE): averaging over the other
    tasks alone would quietly change what the column means."""
    if individual is None:
        return merged, None
    if chance is None or chance.isna().any():
        return merged, "the score files carry no chance level (scored before dpmerge recorded one)"
    low = pd.Series({task: _lower_end(individual[task]) for task in tasks})
    floor = chance + NORMALIZED_MIN_SHARE * (100.0 - chance)
    if unclear := [task for task in tasks if not low[task] >= floor[task]]:
        reasons = ", ".join(f"{task} (chance {chance[task]:.1f}, individual {low[task]:.1f})" for task in unclear)
        return merged, (f"individual models not {100 * NORMALIZED_MIN_SHARE:g} % of the way from chance to 100 by "
                        f"their interval's lower end on {reasons}")
    gap = individual[tasks].mean() - chance
    ratio = 100.0 * (merged[tasks] - chance) / gap
    return merged.assign(**{NORMALIZED: ratio.mean(axis=1, skipna=False)}), None


def _lower_end(values: pd.Series) -> float:
    mean, low, _ = t_interval(values.to_numpy())
    return mean if math.isnan(low) else low


def _with_average_gain(rows: pd.DataFrame, baseline: pd.DataFrame | None) -> pd.DataFrame:
    """The paper's improvement column: this row's average minus the baseline's with the same operator, paired
    per seed; blank when the baseline was not run."""
    if baseline is None:
        return rows
    return rows.assign(**{AVERAGE_GAIN: rows[AVERAGE] - baseline[AVERAGE]})


def _with_metric_headers(table: PaperTable, scores: pd.DataFrame) -> PaperTable:
    """Columns 'task' -> 'task (metric)', e.g. 'cola (mcc)', from the frame's metric column."""
    if "metric" not in scores.columns:
        raise ValueError("metric_in_header: score table lacks column 'metric'")
    metrics = scores.dropna(subset=["metric"]).groupby("task", sort=False)["metric"].unique()
    names = {task: f"{task} ({'/'.join(metrics[task])})" for task in table.mean.columns if task in metrics.index}
    return table.renamed(names)


def table_epsilon_sweep(scores: pd.DataFrame, operator: str = "ties", baseline: str = BASELINE,
                        proposed: str = PROPOSED) -> PaperTable:
    """Table 4: rows = finite privacy budgets ('ε = 1', ascending); per backbone the columns '<backbone> DP',
    '<backbone> DP-Merging' and '<backbone> improvement', each the average over that backbone's tasks of the
    operator's merged scores (improvement paired per seed)."""
    _require_columns(scores, {"backbone", "target_epsilon", "model", "method", "task", "score"}, "Table 4")
    merged = scores[scores["model"] == operator]
    if merged.empty:
        present = sorted(m for m in scores["model"].unique() if m != "individual")
        raise ValueError(f"Table 4: no merged scores of operator {operator!r} (operators present: {present})")
    merged = _with_seed(merged[merged["method"].isin([baseline, proposed])])
    merged = merged.assign(epsilon=merged["target_epsilon"].map(epsilon_value))
    merged = merged[np.isfinite(merged["epsilon"])]
    budgets = {m: set(merged.loc[merged["method"] == m, "epsilon"]) for m in (baseline, proposed)}
    if len(both := budgets[baseline] & budgets[proposed]) < 2:
        raise ValueError(
            f"Table 4 needs at least 2 finite epsilons with both {baseline} and {proposed} merged by {operator}; "
            f"{baseline} has {sorted(budgets[baseline])}, {proposed} has {sorted(budgets[proposed])} "
            f"(in common: {sorted(both)})")
    backbones = list(dict.fromkeys(merged["backbone"]))
    tasks = {b: list(dict.fromkeys(merged.loc[merged["backbone"] == b, "task"])) for b in backbones}
    groups = {key: rows for key, rows in merged.groupby(["backbone", "epsilon", "method"], sort=False)}
    empty = pd.Series(dtype=float)

    rows: dict[str, pd.DataFrame] = {}
    columns: list[str] = []
    for eps in sorted(set(merged["epsilon"])):
        per_seed = {}
        for b in backbones:
            base, ours = (_seed_average(groups[(b, eps, m)], tasks[b]) if (b, eps, m) in groups else empty
                          for m in (baseline, proposed))
            per_seed[f"{b} {label_of(METHOD_LABELS, baseline)}"] = base
            per_seed[f"{b} {label_of(METHOD_LABELS, proposed)}"] = ours
            per_seed[f"{b} improvement"] = ours - base
        columns = list(per_seed)
        rows[f"ε = {eps:g}"] = pd.DataFrame(per_seed)
    return _summarise(rows, columns, stub="Privacy budget")


def table_ablation(scores: pd.DataFrame) -> PaperTable:
    """Table 5 (one backbone, one epsilon): rows DP, w/o Alignment (dp_sam), w/o Flatness (dp_anchor) and
    DP-Merging (full), then each of the last three minus DP, paired per seed (with its 95 % interval from two
    seeds on); columns 'Individual' (own-task scores) and one per merge operator present, each the average over
    tasks. The DP row and the differences are left out when no naive_dp runs are present."""
    _require_columns(scores, {"model", "method", "task", "score"}, "Table 5")
    methods = set(scores["method"])
    if missing := [m for m in ("dp_sam", "dp_anchor", "dp_merging") if m not in methods]:
        raise ValueError(f"Table 5 (ablation) needs runs of {missing}; methods present: {sorted(methods)}")
    used = scores[scores["method"].isin([m for m, _ in ABLATION_ROWS])]
    _one_setting(used, "Table 5")
    used = _with_seed(_own_tasks(used))
    tasks = list(dict.fromkeys(used["task"]))
    operators = [m for m in dict.fromkeys(used["model"]) if m != "individual"]
    columns = ["Individual"] + [operator_label(op) for op in operators]
    groups = {key: rows for key, rows in used.groupby(["method", "model"], sort=False)}

    rows: dict[str, pd.DataFrame] = {}
    for method, label in ABLATION_ROWS:
        if method not in methods:
            continue
        rows[label] = pd.DataFrame({
            column: _seed_average(groups[(method, model)], tasks) if (method, model) in groups
            else pd.Series(dtype=float)
            for column, model in zip(columns, ["individual"] + operators)
        })
    if "DP" in rows:
        for label in [label for label in rows if label != "DP"]:
            rows[f"  improvement ({label} − DP)"] = rows[label] - rows["DP"]  # aligned on seed: paired
    return _summarise(rows, columns)


def table_sensitivity(scores: pd.DataFrame, parameter: str, operator: str = "ties", method: str = "dp_merging",
                      *, fixed: dict[str, float] | None = None) -> PaperTable:
    """Tables 6 (parameter='rho') and 7 (parameter='anchor_lambda'): one row per distinct recorded value of
    `parameter` among `method`'s merges by `operator` ('ρ = 0.05', ascending), after a leading 'DP (naive)'
    reference row from naive_dp's merges by the same operator when present; columns = tasks + 'Avg.'.

    The other hyperparameter must be constant among the swept runs; `fixed` ({column: value}) selects the runs
    where it is (e.g. fixed={'anchor_lambda': 0.05} when the frame holds both sweeps).
    """
    if parameter not in SENSITIVITY_SYMBOLS:
        raise ValueError(f"sensitivity parameter must be one of {sorted(SENSITIVITY_SYMBOLS)}, not {parameter!r}")
    _require_columns(scores, {"model", "method", "task", "score", parameter}, f"sensitivity to {parameter}")
    swept = scores[(scores["model"] == operator) & (scores["method"] == method)]
    if unrecorded := int(swept[parameter].isna().sum()):
        raise ValueError(f"sensitivity to {parameter}: {unrecorded} score rows of {method} + {operator} do not "
                         f"record {parameter} (written before that column existed?); evaluate them again")
    for column, value in (fixed or {}).items():
        _require_columns(scores, {column}, f"sensitivity to {parameter}")
        swept = swept[np.isclose(swept[column].astype(float), value)]
    other = "anchor_lambda" if parameter == "rho" else "rho"
    if other in swept.columns and swept[other].nunique() > 1:
        raise ValueError(f"sensitivity to {parameter}: {other} also varies among {method} + {operator} runs "
                         f"({sorted(map(float, swept[other].unique()))}); pass fixed={{{other!r}: value}}")
    values = sorted(map(float, swept[parameter].unique()))
    if len(values) < 2:
        raise ValueError(f"sensitivity to {parameter} needs at least 2 distinct values among {method} + "
                         f"{operator} runs; found {values}")
    reference = scores[(scores["model"] == operator) & (scores["method"] == "naive_dp")]
    used = _with_seed(pd.concat([reference, swept]))
    _one_setting(used, f"sensitivity to {parameter}")
    tasks = list(dict.fromkeys(used["task"]))

    rows: dict[str, pd.DataFrame] = {}
    if not reference.empty:
        rows["DP (naive)"] = _per_seed_tasks(used[used["method"] == "naive_dp"], tasks)
    ours = used[used["method"] == method]
    for value in values:
        rows[f"{SENSITIVITY_SYMBOLS[parameter]} = {value:g}"] = _per_seed_tasks(ours[ours[parameter] == value],
                                                                                 tasks)
    return _summarise(rows, tasks + [AVERAGE], stub="Setting")


def table_operators(scores: pd.DataFrame, baseline: str = BASELINE, proposed: str = PROPOSED) -> PaperTable:
    """Table 8: rows = merge operators run for both methods; columns 'DP', 'DP-Merging' and 'Improvement'
    (average over tasks; improvement paired per seed)."""
    _require_columns(scores, {"model", "method", "task", "score"}, "Table 8")
    used = scores[(scores["model"] != "individual") & scores["method"].isin([baseline, proposed])]
    _one_setting(used, "Table 8")
    used = _with_seed(used)
    tasks = list(dict.fromkeys(used["task"]))
    groups = {key: rows for key, rows in used.groupby(["model", "method"], sort=False)}
    operators = [op for op in dict.fromkeys(used["model"]) if (op, baseline) in groups and (op, proposed) in groups]
    if not operators:
        raise ValueError(f"Table 8: no merge operator has runs of both {baseline} and {proposed} "
                         f"(operators per method: {sorted(groups)})")
    base_label, ours_label = label_of(METHOD_LABELS, baseline), label_of(METHOD_LABELS, proposed)
    rows = {}
    for op in operators:
        base, ours = _seed_average(groups[(op, baseline)], tasks), _seed_average(groups[(op, proposed)], tasks)
        rows[operator_label(op)] = pd.DataFrame({base_label: base, ours_label: ours, "Improvement": ours - base})
    return _summarise(rows, [base_label, ours_label, "Improvement"], stub="Operator")


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def _as_table(table: PaperTable | pd.DataFrame) -> PaperTable:
    if isinstance(table, PaperTable):
        return table
    if isinstance(table, pd.DataFrame):  # a frame of means alone
        return PaperTable(table, None, pd.Series(pd.NA, index=table.index, dtype="Int64", name="seeds"))
    raise TypeError(f"expected a PaperTable or a DataFrame, got {type(table).__name__}")


def _signed(row, column) -> bool:
    return str(row).strip().lower().startswith("improvement") or "improvement" in str(column).lower()


def _cells(table: PaperTable, pm: str) -> list[tuple[str, list[str | None]]]:
    """(row label, formatted cells; None = missing) per row; `pm` joins mean and std."""
    out = []
    for label, means in table.mean.iterrows():
        cells = []
        for column, mean in means.items():
            if pd.isna(mean):
                cells.append(None)
                continue
            if _signed(label, column):
                cells.append(_difference_cell(table, label, column))
                continue
            text = f"{mean:.1f}"
            std = None if table.std is None else table.std.loc[label, column]
            cells.append(text if std is None or pd.isna(std) else f"{text}{pm}{std:.1f}")
        out.append((str(label).strip(), cells))
    return out


INTERVAL_NOTE = ("Signed cells: mean paired difference over seeds [95 % t-interval]; * marks an interval that "
                 "excludes 0.")


def signed_cell(mean: float, low: float | None = None, high: float | None = None) -> str:
    """'+3.8' with one seed; '+3.8 [-6.3, +13.8]' from two on, starred when the interval excludes 0."""
    text = f"{mean:+.1f}"
    if low is None or pd.isna(low):
        return text
    return f"{text} [{low:+.1f}, {high:+.1f}]" + ("*" if low > 0 or high < 0 else "")


def _difference_cell(table: PaperTable, label, column) -> str:
    if table.low is None:
        return signed_cell(table.mean.loc[label, column])
    return signed_cell(table.mean.loc[label, column], table.low.loc[label, column], table.high.loc[label, column])


def _has_intervals(table: PaperTable) -> bool:
    if table.low is None:
        return False
    return any(_signed(label, column) and pd.notna(table.low.loc[label, column])
               for label in table.mean.index for column in table.mean.columns)


def to_markdown(table: PaperTable | pd.DataFrame, caption: str = "") -> str:
    """Markdown table; 'm ± s' where a cell has several seeds, 'm' otherwise; differences carry a sign."""
    table = _as_table(table)
    header = [table.stub] + [str(c) for c in table.mean.columns]
    lines = ([f"{caption}", ""] if caption else []) + [
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":---"] + ["---:"] * len(table.mean.columns)) + "|",
    ]
    for label, cells in _cells(table, " ± "):
        lines.append("| " + " | ".join([label] + ["" if c is None else c for c in cells]) + " |")
    if _has_intervals(table):
        lines += ["", INTERVAL_NOTE]
    lines += [note for text in table.notes for note in ("", text)]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                          ("ε", r"$\varepsilon$"), ("ρ", r"$\rho$"), ("λ", r"$\lambda$"), ("±", r"$\pm$"),
                          ("∞", r"$\infty$")):
        text = text.replace(char, escaped)
    return text


def to_latex(table: PaperTable | pd.DataFrame, caption: str = "", label: str = "") -> str:
    """booktabs tabular; 'm $\\pm$ s' where a cell has several seeds; differences signed and in italics."""
    table = _as_table(table)
    cols = "l" + "r" * len(table.mean.columns)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    if label:
        lines.append(rf"\label{{{label}}}")
    lines += [rf"\begin{{tabular}}{{{cols}}}", r"\toprule"]
    lines.append(" & ".join([_latex_escape(table.stub)] + [_latex_escape(str(c)) for c in table.mean.columns])
                 + r" \\")
    lines.append(r"\midrule")
    for name, cells in _cells(table, r" $\pm$ "):
        texts = []
        for column, cell in zip(table.mean.columns, cells):
            text = "--" if cell is None else cell
            texts.append(rf"\textit{{{text}}}" if cell is not None and _signed(name, column) else text)
        lines.append(" & ".join([_latex_escape(name)] + texts) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    for text in ([INTERVAL_NOTE] if _has_intervals(table) else []) + list(table.notes):
        lines.append(rf"\par\smallskip{{\footnotesize {_latex_escape(text)}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_frame(table: PaperTable | pd.DataFrame) -> pd.DataFrame:
    """The wide frame write_table stores: 'row', each column's mean; when any cell has several seeds also
    '<column> std', '<column> ci95 low' and '<column> ci95 high' per column, and '<column> seed <s>' for every
    seed's own value; and 'seeds'."""
    table = _as_table(table)
    parts = [table.mean]
    if table.std is not None:
        parts.append(table.std.add_suffix(" std"))
        parts += [table.low.add_suffix(" ci95 low"), table.high.add_suffix(" ci95 high")]
        values = table.per_seed.assign(name=table.per_seed["column"].astype(str) + " seed " + table.per_seed["seed"])
        wide_seeds = values.pivot_table(index="row", columns="name", values="value", aggfunc="first", sort=False)
        order = [f"{column} seed {seed}" for column in table.mean.columns
                 for seed in dict.fromkeys(table.per_seed["seed"])]
        parts.append(wide_seeds.reindex(index=table.mean.index, columns=[c for c in order if c in wide_seeds]))
    parts.append(table.seeds.to_frame("seeds"))
    wide = pd.concat(parts, axis=1)
    wide.index.name = "row"
    return wide.reset_index()


def to_html(table: PaperTable | pd.DataFrame, caption: str = "") -> str:
    """A standalone HTML page (what `snakemake --report` shows); 'm ± s' cells as in Markdown."""
    table = _as_table(table)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in [table.stub, *table.mean.columns])
    body = []
    for label, cells in _cells(table, " ± "):
        tds = "".join(f"<td>{'' if c is None else html.escape(c)}</td>" for c in cells)
        body.append(f"<tr><th>{html.escape(label)}</th>{tds}</tr>")
    note = "".join(f"<p>{html.escape(text)}</p>"
                   for text in ([INTERVAL_NOTE] if _has_intervals(table) else []) + list(table.notes))
    style = ("body{font-family:sans-serif}table{border-collapse:collapse}th,td{padding:2px 8px}"
             "td{text-align:right}thead th{border-bottom:1px solid #000}caption{text-align:left;padding:4px}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{style}</style></head><body><table>"
            f"<caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}"
            f"</tbody></table>{note}</body></html>\n")


def write_table(table: PaperTable | pd.DataFrame, prefix: str | Path, caption: str) -> list[Path]:
    """Write <prefix>.parquet (see `to_frame`), .md, .tex and .html (atomically) and return their paths."""
    prefix = str(prefix)  # not Path.with_suffix: a prefix such as table1_x_eps0.5 has a dot of its own
    paths = [Path(prefix + ext) for ext in (".parquet", ".md", ".tex", ".html")]
    atomic_write(paths[0], lambda tmp: to_frame(table).to_parquet(tmp, index=False))
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text(to_markdown(table, caption)))
    atomic_write(paths[2], lambda tmp: Path(tmp).write_text(to_latex(table, caption, f"tab:{Path(prefix).name}")))
    atomic_write(paths[3], lambda tmp: Path(tmp).write_text(to_html(table, caption)))
    return paths
