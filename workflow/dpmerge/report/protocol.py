"""The training-budget protocol's choice: per backbone kind, the candidate setting (trainable blocks, learning
rate, epochs, batch size) whose private methods' individual models score best on average on a validation split
held out of each task's training data. The rule is fixed before anything is merged, is the same for every
method (all private methods share the chosen setting, as they share one prepared trunk), and reads no test
example and no merged model.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpmerge.report.labels import AVERAGE, METHOD_LABELS, PRIVATE_MERGED_METHODS

PRIVATE_METHODS = PRIVATE_MERGED_METHODS  # the candidates are judged on the methods that are merged later
SETTINGS = ("trainable_blocks", "lr", "epochs", "batch_size")


def individual_averages(table: pd.DataFrame) -> dict[str, float]:
    """Method -> Table 1's 'Avg.' of its individual models (mean over seeds), for the private methods run."""
    found = {}
    for method in PRIVATE_METHODS:
        rows = table[table["row"] == f"{METHOD_LABELS[method]} Individual"]
        if not rows.empty and pd.notna(rows.iloc[0][AVERAGE]):
            found[method] = float(rows.iloc[0][AVERAGE])
    return found


def choose(candidates: dict[str, dict], tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per candidate: its kind and settings, each private method's validation average, their mean
    ('pooled') and whether it is its kind's choice (the highest pooled; ties go to the first listed)."""
    rows = []
    for name, settings in candidates.items():
        averages = individual_averages(tables[name])
        if not averages:
            raise ValueError(f"candidate {name}: its Table 1 has no private method's individual row")
        rows.append({"candidate": name, "kind": settings["kind"], **{s: settings.get(s) for s in SETTINGS},
                     **{f"{METHOD_LABELS[m]} (validation)": v for m, v in averages.items()},
                     "pooled": sum(averages.values()) / len(averages)})
    frame = pd.DataFrame(rows)
    frame["chosen"] = False
    for _, group in frame.groupby("kind", sort=False):
        frame.loc[group["pooled"].idxmax(), "chosen"] = True
    return frame


def to_markdown(frame: pd.DataFrame, seeds: int) -> str:
    shown = frame.drop(columns=["chosen"]).copy()
    lines = ["# Training budget: the protocol's choice", "",
             "Every candidate fine-tuned the private methods on each task with a seeded part of the task's training "
             f"split held out as validation ({seeds} seed(s)); the score is the individual models' average over "
             "tasks on that validation split (0-100). Rule, fixed before anything was merged: per backbone kind, "
             "the candidate with the highest mean over the private methods ('pooled'). No test example and no "
             "merged model was read.", "",
             "| " + " | ".join(list(shown.columns) + ["chosen"]) + " |",
             "|" + "|".join(["---"] * (len(shown.columns) + 1)) + "|"]
    for (_, row), chosen in zip(shown.iterrows(), frame["chosen"]):
        cells = [f"{v:.1f}" if isinstance(v, float) and c not in ("lr",) else str(v) for c, v in row.items()]
        lines.append("| " + " | ".join(cells + ["**yes**" if chosen else ""]) + " |")
    return "\n".join(lines) + "\n"


def write_choice(*, candidates: dict[str, dict], tables: dict[str, str], out_markdown: str, out_parquet: str,
                 seeds: int) -> pd.DataFrame:
    from dpmerge.artifacts import atomic_write

    frame = choose(candidates, {name: pd.read_parquet(path) for name, path in tables.items()})
    atomic_write(out_parquet, lambda path: frame.to_parquet(path, index=False))
    text = to_markdown(frame, seeds)
    atomic_write(out_markdown, lambda path: Path(path).write_text(text))
    return frame
