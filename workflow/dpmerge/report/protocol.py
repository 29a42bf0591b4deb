"""The training-budget protocol's choice: per backbone kind, the cheapest candidate setting (trainable blocks,
learning rate, epochs, batch size) whose private methods' individual models score, on a validation split held out
of each task's training data, within one standard error of the best candidate's. The rule is the same for every
method (all private methods share the chosen setting, as they share one prepared trunk) and reads no test example
and no merged model.

The tie rule, one standard error of the paired difference: the best candidate is the one with the highest mean
over the private methods ("pooled"); another candidate ties with it when the mean of its per-method differences
from the best is at most their standard error (sample standard deviation / sqrt(methods)); with one seed per
candidate, single methods move by several points between neighbouring settings, so a smaller gap is noise, not
evidence. Among the tied candidates the cheapest wins (training cost: epochs x trainable blocks, the trained
part's passes over the data; "all" blocks costs most), and equal costs go to the higher pooled score.

The signal criterion, fixed before the candidates run: a merged score on a task whose individual models learned
nothing measures noise, so where the signal check's validation scores are given (report/signal_check.py), a
candidate "carries signal" when every private method's individual model on every task reaches the private share
of the way from chance to 100 (the check's threshold, 0.3 by default). Where some candidate of a kind carries
signal, the choice is made among those alone: the cheapest, equal costs to the higher pooled score. Where none
does, the rule above chooses, and the table says that no candidate met the criterion.

The non-private reference's own budget (presets/protocol_reference.yaml): a run of the non-private method alone
is judged on it. One method gives no standard error, so nothing ties with the best and the best is chosen: a
reference is the ceiling the private models are measured against, so its cost is not a criterion.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dpmerge.artifacts import atomic_write
from dpmerge.methods import PRIVATE_MERGED_METHODS
from dpmerge.report.labels import AVERAGE, METHOD_LABELS

PRIVATE_METHODS = PRIVATE_MERGED_METHODS  # the candidates are judged on the methods that are merged later
REFERENCE = "nonprivate"
SETTINGS = ("trainable_blocks", "lr", "head_lr", "epochs", "batch_size")
SIGNAL = "signal cells met"


def individual_averages(table: pd.DataFrame, methods=PRIVATE_METHODS) -> dict[str, float]:
    """Method -> Table 1's 'Avg.' of its individual models (mean over seeds), for those of `methods` run."""
    found = {}
    for method in methods:
        rows = table[table["row"] == f"{METHOD_LABELS[method]} Individual"]
        if not rows.empty and pd.notna(rows.iloc[0][AVERAGE]):
            found[method] = float(rows.iloc[0][AVERAGE])
    return found


def training_cost(settings: dict) -> float:
    """Epochs x trainable blocks: how many times the trained part of the network sees each example."""
    blocks = settings.get("trainable_blocks") or 1  # unset: the schema's default, 1
    blocks = math.inf if blocks == "all" else float(blocks)
    return float(settings.get("epochs") or 1.0) * blocks


def gap_to_best(best: dict[str, float], other: dict[str, float]) -> tuple[float, float]:
    """(mean, standard error) of best - other over the private methods both ran; the error is NaN with fewer
    than two such methods, so no tie can be shown."""
    differences = [best[m] - other[m] for m in best if m in other]
    if not differences:
        return math.nan, math.nan
    mean = sum(differences) / len(differences)
    if len(differences) < 2:
        return mean, math.nan
    variance = sum((d - mean) ** 2 for d in differences) / (len(differences) - 1)
    return mean, math.sqrt(variance / len(differences))


def signal_cells(signal: pd.DataFrame, candidate: str) -> tuple[int, int]:
    """(met, all) of the candidate's (task, private method) cells in the signal check: met where the validation
    score reaches its threshold share of the way from chance to 100."""
    rows = signal[(signal["backbone"] == candidate) & signal["method"].isin(PRIVATE_METHODS)]
    return int(rows["meets_threshold"].sum()), len(rows)


def choose(candidates: dict[str, dict], tables: dict[str, pd.DataFrame],
           signal: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per candidate: its kind and settings, each private method's validation average, their mean
    ('pooled'), its gap to its kind's best with the gap's standard error, whether it ties with the best, its
    training cost, with `signal` (the signal check's frame) how many of its (task, private method) cells meet the
    signal criterion, and whether it is its kind's choice (see the module's rule)."""
    rows, averages_of = [], {}
    # judged on the private methods wherever one ran; a run of the reference alone on the reference
    judged = PRIVATE_METHODS if any(individual_averages(t) for t in tables.values()) else (REFERENCE,)
    for name, settings in candidates.items():
        averages = individual_averages(tables[name], judged)
        if not averages:
            raise ValueError(f"candidate {name}: its Table 1 has no individual row of "
                             f"{' or '.join(METHOD_LABELS[m] for m in judged)}")
        averages_of[name] = averages
        rows.append({"candidate": name, "kind": settings["kind"], **{s: settings.get(s) for s in SETTINGS},
                     **{f"{METHOD_LABELS[m]} (validation)": v for m, v in averages.items()},
                     "pooled": sum(averages.values()) / len(averages), "cost": training_cost(settings)})
    frame = pd.DataFrame(rows)
    if judged != PRIVATE_METHODS:
        signal = None  # the signal criterion is the private methods'; the reference's check is its own threshold
    if signal is not None:
        counts = [signal_cells(signal, name) for name in frame["candidate"]]
        frame[SIGNAL] = [f"{met}/{total}" for met, total in counts]
        frame["carries signal"] = [total > 0 and met == total for met, total in counts]
    frame["gap to best"] = math.nan
    frame["gap SE"] = math.nan
    frame["tied"] = False
    frame["chosen"] = False
    for _, group in frame.groupby("kind", sort=False):
        best = group["pooled"].idxmax()  # ties in pooled go to the first listed
        best_averages = averages_of[frame.at[best, "candidate"]]
        for index in group.index:
            gap, error = gap_to_best(best_averages, averages_of[frame.at[index, "candidate"]])
            frame.loc[index, ["gap to best", "gap SE"]] = [gap, error] if index != best else [0.0, 0.0]
            frame.at[index, "tied"] = bool(index == best or gap <= error)  # False where NaN
        pool = frame.loc[group.index][frame.loc[group.index, "tied"]]
        if signal is not None and frame.loc[group.index, "carries signal"].any():
            pool = frame.loc[group.index][frame.loc[group.index, "carries signal"]]
        cheapest = pool.sort_values(["cost", "pooled"], ascending=[True, False], kind="stable").index[0]
        frame.at[cheapest, "chosen"] = True
    return frame


def to_markdown(frame: pd.DataFrame, seeds: int) -> str:
    shown = frame.drop(columns=["chosen"]).copy()
    reference = f"{METHOD_LABELS[REFERENCE]} (validation)" in frame
    rule = ("Rule: per backbone kind, the candidate with the highest non-private validation average is chosen "
            "(the reference's own budget: a ceiling, so cost is not a criterion)." if reference else
            "Rule: per backbone kind, the best candidate has the highest mean over the private methods ('pooled'); "
            "a candidate ties with it when its mean per-method gap to the best is at most the gap's standard error; "
            "the cheapest tied candidate (epochs x trainable blocks; equal costs: the higher pooled) is chosen.")
    title = "# Training budget: the protocol's choice" + (" for the non-private reference" if reference else "")
    trained = "non-private method" if reference else "private methods"
    lines = [title, "",
             f"Every candidate fine-tuned the {trained} on each task with a seeded part of the task's training split "
             f"held out as validation ({seeds} seed(s)); the score is the individual models' average over tasks on "
             f"that validation split (0-100). {rule} No test example and no merged model was read.", "",
             *(["Signal criterion (fixed before the candidates ran): where some candidate of a kind has every "
                "private method's individual model on every task at least its threshold share of the way from "
                "chance to 100 on the validation split ('signal cells met', from the signal check), the cheapest "
                "such candidate is chosen instead (equal costs: the higher pooled)."
                + _unmet(frame), ""] if SIGNAL in frame else []),
             "| " + " | ".join(list(shown.columns) + ["chosen"]) + " |",
             "|" + "|".join(["---"] * (len(shown.columns) + 1)) + "|"]
    for (_, row), chosen in zip(shown.iterrows(), frame["chosen"]):
        cells = [_cell(c, v) for c, v in row.items()]
        lines.append("| " + " | ".join(cells + ["**yes**" if chosen else ""]) + " |")
    return "\n".join(lines) + "\n"


def _cell(column: str, value) -> str:
    if column in ("tied", "carries signal"):
        return "yes" if value else ""
    if column in ("lr", "head_lr"):  # rates as given; an unset head rate is the top's
        return "= lr" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:g}"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _unmet(frame: pd.DataFrame) -> str:
    kinds = [kind for kind, group in frame.groupby("kind", sort=False) if not group["carries signal"].any()]
    return f" For {', '.join(kinds)} no candidate met it, so the rule above chose." if kinds else ""


def write_choice(*, candidates: dict[str, dict], tables: dict[str, str], out_markdown: str, out_parquet: str,
                 seeds: int, signal_check: str | None = None) -> pd.DataFrame:

    signal = None if signal_check is None else pd.read_parquet(signal_check)
    frame = choose(candidates, {name: pd.read_parquet(path) for name, path in tables.items()}, signal)
    atomic_write(out_parquet, lambda path: frame.to_parquet(path, index=False))
    text = to_markdown(frame, seeds)
    atomic_write(out_markdown, lambda path: Path(path).write_text(text))
    return frame
