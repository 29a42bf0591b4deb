"""The signal check: does every task's individual model learn anything at the study's budget?

A merge of models that learned nothing measures nothing, and a near-chance task lets a difference flip sign
between seeds, so before any merged result is read each task's individual models (own task, every method and
budget of the main grid) are set against the task's chance level under its metric (metrics.chance_level, from
the test split's labels, carried in every score row as `chance`). Per (backbone, task, method, budget): the mean
over seeds with its 95 % t-interval, and how far of the way from chance to a perfect score its lower end lies,
(low - chance) / (100 - chance). A private method whose interval does not lie above chance flags the task as
carrying no signal; one below its threshold (config `tables.signal_check`) as weak. With one seed there is no
interval, and the point estimate stands in for the lower end (the table says so).
"""

from __future__ import annotations

import math

import pandas as pd

from dpmerge.artifacts import atomic_write
from dpmerge.epsilon import epsilon_value
from dpmerge.methods import METHODS
from dpmerge.report.labels import METHOD_LABELS
from dpmerge.report.small_table import epsilon_text, interval_cell, write_small_table
from dpmerge.report.tables import t_interval

# Shares of the way from chance to a perfect score that an individual model's interval must reach by its lower
# end: the defaults of config `signal_check` (workflow/schemas/config.schema.yaml)
NONPRIVATE_SHARE = 0.6
PRIVATE_SHARE = 0.3

NO_SIGNAL, WEAK, PASSES = "no signal", "weak", "passes"
NEEDED = {"backbone", "method", "target_epsilon", "seed", "model", "task", "score", "metric", "chance"}


def individual_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """The rows the check reads: individual models on their own task. Refuses score files without a chance
    level (scored before dpmerge recorded one) by name of the missing column."""
    if missing := NEEDED - set(scores.columns):
        raise ValueError(f"score files lack column(s) {sorted(missing)}: the signal check needs each row's "
                         "chance level, which 'dpmerge evaluate' records since it was added; rescore them")
    rows = scores[scores["model"] == "individual"]
    if "source_task" in rows.columns:
        rows = rows[rows["source_task"] == rows["task"]]
    if rows.empty:
        raise ValueError("no individual model scored on its own task among the score files")
    return rows


def _chance(rows: pd.DataFrame, where: str) -> float:
    levels = rows["chance"].astype(float).round(6).unique()
    if len(levels) != 1 or not math.isfinite(levels[0]):
        raise ValueError(f"{where}: the score files disagree on the chance level ({sorted(levels)}); they were "
                         "scored on different test splits")
    return float(levels[0])


def _method_order(method: str) -> int:
    order = list(METHODS)
    return order.index(method) if method in order else len(order)


def signal_rows(scores: pd.DataFrame, *, nonprivate_share: float = NONPRIVATE_SHARE,
                private_share: float = PRIVATE_SHARE) -> pd.DataFrame:
    """One row per (backbone, task, method, budget): chance, seeds, mean, 95 % interval, the lower end's share of
    the way from chance to 100 (the point estimate's with one seed), the threshold for that method (private or
    not), whether it beats chance and whether it meets the threshold."""
    rows = individual_scores(scores)
    rows = rows.assign(epsilon=rows["target_epsilon"].map(epsilon_value))
    out = []
    for (backbone, task), task_rows in rows.groupby(["backbone", "task"], sort=False):
        chance = _chance(task_rows, f"{backbone}/{task}")
        metric = "/".join(task_rows["metric"].astype(str).unique())
        for (method, epsilon), group in task_rows.groupby(["method", "epsilon"], sort=False):
            per_seed = group.groupby("seed")["score"].mean()
            mean, low, high = t_interval(per_seed.to_numpy())
            lower = mean if math.isnan(low) else low
            headroom = 100.0 - chance
            share = (lower - chance) / headroom if headroom > 0 else math.nan
            private = METHODS[method].private if method in METHODS else math.isfinite(epsilon)
            threshold = private_share if private else nonprivate_share
            beats = bool(lower > chance)
            out.append({
                "backbone": backbone, "task": task, "metric": metric, "chance": chance, "method": method,
                "target_epsilon": float(epsilon), "private": bool(private), "seeds": int(per_seed.size),
                "mean": mean, "ci95_low": low, "ci95_high": high, "share_of_headroom": share,
                "threshold": threshold, "beats_chance": beats,
                "meets_threshold": bool(beats and share >= threshold),
            })
    frame = pd.DataFrame(out)
    backbones = list(dict.fromkeys(rows["backbone"]))
    tasks = list(dict.fromkeys(rows["task"]))
    frame = frame.assign(_b=frame["backbone"].map(backbones.index), _t=frame["task"].map(tasks.index),
                         _order=frame["method"].map(_method_order))
    frame = frame.sort_values(["_b", "_t", "_order", "target_epsilon"], kind="stable")
    return frame.drop(columns=["_order", "_b", "_t"]).reset_index(drop=True)


def task_verdicts(signal: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, task): 'no signal' when any private method's individual models do not beat chance by
    their interval, 'weak' when any method misses its threshold, else 'passes'; with the methods behind it."""
    out = []
    for (backbone, task), rows in signal.groupby(["backbone", "task"], sort=False):
        silent = rows[rows["private"] & ~rows["beats_chance"]]
        weak = rows[~rows["meets_threshold"]]
        if len(silent):
            verdict, culprits = NO_SIGNAL, silent
        elif len(weak):
            verdict, culprits = WEAK, weak
        else:
            verdict, culprits = PASSES, rows.iloc[:0]
        out.append({"backbone": backbone, "task": task, "verdict": verdict,
                    "methods": ", ".join(column_label(r.method, r.target_epsilon) for r in culprits.itertuples())})
    return pd.DataFrame(out, columns=["backbone", "task", "verdict", "methods"])


def column_label(method: str, epsilon: float) -> str:
    label = METHOD_LABELS.get(method, method)
    return label if not math.isfinite(epsilon) else f"{label}, ε = {epsilon_text(epsilon)}"


def wide_table(signal: pd.DataFrame) -> pd.DataFrame:
    """One row per (backbone, task): chance, then per (method, budget) 'mean [low, high] · share', then the
    verdict; the frame the Markdown table and the answer page show."""
    verdicts = task_verdicts(signal).set_index(["backbone", "task"])
    columns = list(dict.fromkeys(column_label(r.method, r.target_epsilon) for r in signal.itertuples()))
    out = []
    for (backbone, task), rows in signal.groupby(["backbone", "task"], sort=False):
        first = rows.iloc[0]
        row = {"Backbone": backbone, "Task (metric)": f"{task} ({first['metric']})",
               "Chance": f"{first['chance']:.1f}"}
        cells = {column_label(r.method, r.target_epsilon): _cell(r) for r in rows.itertuples()}
        row.update({c: cells.get(c, "–") for c in columns})
        verdict = verdicts.loc[(backbone, task)]
        row["Verdict"] = verdict["verdict"] + (f" ({verdict['methods']})" if verdict["methods"] else "")
        out.append(row)
    return pd.DataFrame(out)


def _cell(row) -> str:
    share = "–" if math.isnan(row.share_of_headroom) else f"{row.share_of_headroom:.2f}".replace("-", "−")
    return f"{interval_cell(row.mean, row.ci95_low, row.ci95_high)} · {share}"


def note(signal: pd.DataFrame) -> str:
    one_seed = bool((signal["seeds"] < 2).any())
    thresholds = signal.groupby("private")["threshold"].first()
    parts = [
        "Each task's individual models (own task) against the task's chance level under its metric (the best "
        "score of a predictor that ignores its input, on the labels the models are scored on): mean over seeds [95 % "
        "t-interval] · the interval's lower end as a share of the way from chance to 100.",
        "no signal: a private method's interval does not lie above chance;",
        (f"weak: a method's share is below its threshold ({_thresholds(thresholds)}).")]
    if one_seed:
        parts.append("With one seed there is no interval, and the point estimate stands in for its lower end.")
    return " ".join(parts)


def _thresholds(thresholds: pd.Series) -> str:
    names = {True: "private", False: "non-private"}
    return ", ".join(f"{names[bool(k)]} {v:g}" for k, v in thresholds.sort_index(ascending=False).items())


def silent_tasks(signal: pd.DataFrame) -> list[str]:
    """'backbone/task' of every task flagged 'no signal'."""
    verdicts = task_verdicts(signal)
    return [f"{r.backbone}/{r.task}" for r in verdicts.itertuples() if r.verdict == NO_SIGNAL]


def summary_line(signal: pd.DataFrame) -> str:
    """One sentence for the answer page naming the tasks that carry no signal or are weak."""
    verdicts = task_verdicts(signal)
    silent = silent_tasks(signal)
    weak = [f"{r.backbone}/{r.task}" for r in verdicts.itertuples() if r.verdict == WEAK]
    if not silent and not weak:
        return (f"Signal check: all {len(verdicts)} tasks' individual models beat chance by their interval and "
                "reach their thresholds.")
    parts = []
    if silent:
        carry = "carries" if len(silent) == 1 else "carry"
        parts.append(f"{len(silent)} of {len(verdicts)} tasks {carry} no signal at this budget (a private individual "
                     f"model's interval does not lie above chance): {', '.join(silent)}; a merged score on them "
                     "measures noise, and averages over tasks include it")
    if weak:
        parts.append(f"{len(weak)} of {len(verdicts)} tasks {'is' if len(weak) == 1 else 'are'} weak (below a "
                     f"threshold): {', '.join(weak)}")
    return "Signal check: " + "; ".join(parts) + "."


def write_signal_check(signal: pd.DataFrame, prefix: str) -> list:
    """PREFIX.parquet (the long frame, numeric), .md and .tex (one row per task)."""
    wide = wide_table(signal)
    headers = {c: c for c in wide.columns}
    caption = "Signal check: does each task's individual model beat chance at this budget?"
    paths = write_small_table(wide, prefix, caption, headers, lambda column, row: str(row[column]),
                              text_columns=2, markdown_after=["", note(signal)])
    # the Parquet file is the numeric long frame, not the formatted one
    atomic_write(paths[0], lambda tmp: signal.to_parquet(tmp, index=False))
    return paths
