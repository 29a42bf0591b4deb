"""The privacy ledger: one row per released task vector, checked as a whole.

Checks: every private row carries the full record and spent <= target epsilon; within one release group
(backbone, method and its rho / lambda, target epsilon, seed) each task appears once and the tasks' datasets are
disjoint, so the group's release is (max epsilon, max delta)-DP by parallel composition (paper, Thm. 5.1).

Each release group is one experiment's release: the grid's other budgets, seeds, methods and sensitivity settings
are alternative experiments on the same data, each accounted on its own. Publishing several of them together
composes their budgets; the report says so.
"""

from __future__ import annotations

import math

import pandas as pd

from dpmerge.taskvectors import PRIVACY_FIELDS, read_metadata

# rho and anchor_lambda tell a sensitivity sweep's runs (Tables 6, 7) apart from the method's default run
GROUP = ["backbone", "method", "rho", "anchor_lambda", "target_epsilon", "seed"]


def build_ledger(paths: list[str]) -> pd.DataFrame:
    rows = []
    for path in paths:
        meta = read_metadata(path)
        row = {"path": str(path), "task": meta.get("task"), "backbone": meta.get("backbone")}
        for field in PRIVACY_FIELDS:
            value = meta.get(field)
            row[field] = str(value) if field in ("target_epsilon", "spent_epsilon") else value
        row["record_complete"] = all(field in meta for field in PRIVACY_FIELDS)
        rows.append(row)
    return pd.DataFrame(rows)


def _as_float(value) -> float:
    return math.inf if value in ("inf", None) else float(value)


def check_ledger(ledger: pd.DataFrame) -> list[str]:
    problems = []
    for row in ledger.itertuples():
        if not row.record_complete:
            problems.append(f"{row.path}: incomplete privacy record")
            continue
        if row.method != "nonprivate" and _as_float(row.spent_epsilon) > _as_float(row.target_epsilon):
            problems.append(f"{row.path}: spent epsilon {row.spent_epsilon} exceeds target {row.target_epsilon}")
    for key, group in ledger.groupby(GROUP, dropna=False):
        duplicated = group["task"][group["task"].duplicated()].tolist()
        if duplicated:
            problems.append(f"release group {key}: task(s) {duplicated} released twice (budgets would compose)")
    return problems


STATISTICS_COLUMNS = ["path", "kind", "source", "backbone", "method", "target_epsilon", "seed", "task", "examples",
                      "clip_norm", "noise_multiplier", "statistic_epsilon", "finetune_spent_epsilon",
                      "total_epsilon", "task_vector_sha256"]


def build_statistics_ledger(paths: list[str]) -> pd.DataFrame:
    """One row per task of every merge-statistics file: its data source and, for private statistics, the
    budget composed with that task's fine-tuning."""
    rows = []
    for path in paths:
        meta = read_metadata(path)
        for record in meta.get("records", []):
            rows.append({"path": str(path), "kind": meta.get("kind"), "source": meta.get("source"),
                         "backbone": meta.get("backbone"), "method": meta.get("method"),
                         "target_epsilon": str(meta.get("target_epsilon")), "seed": meta.get("seed"),
                         **{k: (str(v) if "epsilon" in k else v) for k, v in record.items()}})
    frame = pd.DataFrame(rows, columns=STATISTICS_COLUMNS)
    return frame


def check_statistics(statistics: pd.DataFrame, ledger: pd.DataFrame) -> list[str]:
    """Statistics of private data must be privatized (or belong to a non-private run) and name a task vector
    the ledger holds."""
    problems = []
    released = set(ledger["task"].astype(str) + "|" + ledger["backbone"].astype(str))
    for row in statistics.itertuples():
        if row.source == "private" and row.method != "nonprivate" and pd.isna(row.total_epsilon):
            problems.append(f"{row.path}: private statistics of task {row.task} without a composed budget")
        if f"{row.task}|{row.backbone}" not in released:
            problems.append(f"{row.path}: statistics of task {row.task} whose task vector is not in the ledger")
    return problems


def ledger_report(ledger: pd.DataFrame, problems: list[str], statistics: pd.DataFrame | None = None) -> str:
    lines = ["# Privacy ledger", "", f"{len(ledger)} released task vectors.", ""]
    lines += ["## Release groups (parallel composition over disjoint task datasets)", ""]
    lines += ["Each group is one experiment's release. Groups on the same tasks (other budgets, seeds, methods or "
              "rho / lambda) are alternative experiments on the same data: publishing several composes their budgets.",
              ""]
    lines += ["| backbone | method | rho | lambda | target eps | seed | tasks | max spent eps | max delta |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, group in ledger.groupby(GROUP, dropna=False):
        spent = max(_as_float(v) for v in group["spent_epsilon"])
        delta = max(float(v) for v in group["delta"])
        backbone, method, rho, anchor_lambda, target, seed = key
        lines.append(f"| {backbone} | {method} | {rho:g} | {anchor_lambda:g} | {target} | {seed} | {len(group)} | "
                     f"{spent:.4f} | {delta:.3g} |")
    if statistics is not None and len(statistics):
        lines += ["", "## Merge statistics (RegMean Grams, Fisher)", "",
                  "Public statistics read only examples held out of private training (no privacy cost). Private "
                  "ones are clipped and noised, and compose with the task's fine-tuning: the total is the task's "
                  "budget once that merge is released.", "",
                  "| file | kind | source | method | target eps | task | examples | sigma | total eps |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in statistics.itertuples():
            total = "--" if pd.isna(row.total_epsilon) else f"{_as_float(row.total_epsilon):.4f}"
            sigma = "--" if pd.isna(row.noise_multiplier) else f"{float(row.noise_multiplier):.3f}"
            lines.append(f"| {row.path} | {row.kind} | {row.source} | {row.method} | {row.target_epsilon} | "
                         f"{row.task} | {row.examples} | {sigma} | {total} |")
    lines += ["", "## Check", ""]
    lines += [f"- FAIL: {p}" for p in problems] or ["- every record complete and within its budget: PASS"]
    return "\n".join(lines) + "\n"
