"""The privacy ledger: one row per released task vector, checked as a whole.

Checks: every private row carries the full record and spent <= target epsilon; within one release group
(backbone, method, target epsilon, seed) each task appears once and the tasks' datasets are disjoint, so the
group's release is (max epsilon, max delta)-DP by parallel composition (paper, Thm. 5.1).
"""

from __future__ import annotations

import math

import pandas as pd

from dpmerge.taskvectors import PRIVACY_FIELDS, read_metadata

GROUP = ["backbone", "method", "target_epsilon", "seed"]


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


def ledger_report(ledger: pd.DataFrame, problems: list[str]) -> str:
    lines = ["# Privacy ledger", "", f"{len(ledger)} released task vectors.", ""]
    lines += ["## Release groups (parallel composition over disjoint task datasets)", ""]
    lines += ["| backbone | method | target eps | seed | tasks | max spent eps | max delta |", "|---|---|---|---|---|---|---|"]
    for key, group in ledger.groupby(GROUP, dropna=False):
        spent = max(_as_float(v) for v in group["spent_epsilon"])
        delta = max(float(v) for v in group["delta"])
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(group)} | {spent:.4f} | {delta:.3g} |"
        )
    lines += ["", "## Check", ""]
    lines += [f"- FAIL: {p}" for p in problems] or ["- every record complete and within its budget: PASS"]
    return "\n".join(lines) + "\n"
