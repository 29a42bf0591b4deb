"""The privacy audits in the ledger: what each audit run cost its task, and what the audits refute.

An audit run (stages/audit.py) reads its task's private training data: its record's mechanisms compose with the
task's releases (ledger.task_composition), even though its vector is never released, because the bound it
publishes is computed from it. A merged-model audit adds no mechanism: it post-processes the kept runs.

The check recomputes each audit's claim from the run's own record, never trusting the number in its row, and
fails when a bound exceeds that claim: the run is then not the mechanism its record says it is.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from dpmerge.artifacts import PRIVACY_FIELDS
from dpmerge.privacy.accounting import composed_epsilon, record_mechanisms
from dpmerge.privacy.randomness import RNG_MODES

AUDIT_COLUMNS = ["path", "backbone", "task", "method", "target_epsilon", "seed", "audit", "model", "operator", "group",
                 "canaries", "included", "guesses", "correct", "epsilon_lb", "audit_delta",
                 "claimed_epsilon_at_audit_delta", "recomputed_claim", "verdict", "record_complete", "randomness",
                 "mechanisms", "delta"]

# The claim recomputed from a record may differ from the audit's own number by float rounding only.
CLAIM_TOLERANCE = 1e-6


def _private(record: dict) -> bool:
    return record.get("accountant") is not None and record.get("method") != "nonprivate"


def claimed_epsilon(record: dict, delta: float) -> float:
    """The epsilon an audited run claims at the audit's `delta`, from what its record says ran (sigma, q, steps by
    queries), never from the configuration; infinite for a non-private run."""
    if not _private(record):
        return math.inf
    return composed_epsilon(record_mechanisms(record), float(delta), record["accountant"])


def build_audit_ledger(paths: list[str]) -> pd.DataFrame:
    """One row per audited model: every row of every audit file (`dpmerge audit`, `dpmerge audit-merge`)."""
    rows = []
    for path in paths:
        for row in pd.read_parquet(path).to_dict("records"):
            merged = row.get("model") == "merged"
            record = {} if merged else json.loads(row["privacy_record"])
            private = not merged and _private(record)
            claim = claimed_epsilon(record, row["audit_delta"]) if private else math.inf
            rows.append({
                "path": str(path), **{k: row.get(k) for k in ("backbone", "task", "method", "target_epsilon", "seed",
                                                              "audit", "canaries", "included", "guesses", "correct",
                                                              "epsilon_lb", "audit_delta",
                                                              "claimed_epsilon_at_audit_delta", "verdict")},
                "model": "merged" if merged else "individual", "operator": row.get("operator"),
                "group": row.get("group") or "all",  # a group's row re-reads the same run: no mechanism of its own
                "recomputed_claim": claim if not merged else float(row["claimed_epsilon_at_audit_delta"]),
                "record_complete": merged or all(field in record for field in PRIVACY_FIELDS),
                "randomness": record.get("randomness"),
                "mechanisms": json.dumps(record_mechanisms(record)) if private and row.get("group", "all") == "all"
                else "[]",
                "delta": float(record["delta"]) if private else 0.0,
            })
    table = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
    # A merged model's claim is its task's audit run's: recomputed there, from that run's record.
    same = ["backbone", "task", "method", "seed", "audit"]
    runs = table[(table["model"] == "individual") & (table["group"] == "all")].set_index(same)["recomputed_claim"]
    for index in table.index[table["model"] == "merged"]:
        key = tuple(table.loc[index, same])
        if key in runs.index:
            table.loc[index, "recomputed_claim"] = float(runs.loc[key]) if runs.index.is_unique else math.nan
    return table


def check_audits(audits: pd.DataFrame) -> list[str]:
    problems = []
    for row in audits.itertuples():
        where = f"{row.path} ({row.task}, {row.model}{' ' + row.operator if isinstance(row.operator, str) else ''})"
        if not row.record_complete:
            problems.append(f"{where}: the audit run's privacy record is incomplete")
            continue
        if row.model == "individual" and row.method != "nonprivate" and row.randomness not in RNG_MODES:
            problems.append(f"{where}: the audit run's randomness {row.randomness!r} is not keyed by the study key")
        claim = float(row.recomputed_claim)
        if not math.isclose(claim, float(row.claimed_epsilon_at_audit_delta), rel_tol=CLAIM_TOLERANCE):
            problems.append(f"{where}: states a claim of {row.claimed_epsilon_at_audit_delta} at delta "
                            f"{row.audit_delta:g}, its record gives {claim:.6f}")
        if float(row.epsilon_lb) > claim:
            problems.append(f"{where}: the audit's lower bound {row.epsilon_lb:.4f} exceeds the epsilon "
                            f"{claim:.4f} its record claims at delta {row.audit_delta:g}: the run is not the "
                            "mechanism it is accounted as")
    return problems


def audit_mechanisms(audits: pd.DataFrame | None, task: str) -> tuple[list[tuple], int]:
    """The mechanisms of every private audit run on `task` (they compose with its releases), and how many runs."""
    if audits is None or not len(audits):
        return [], 0
    runs = audits[(audits["task"] == task) & (audits["model"] == "individual") & (audits["group"] == "all")
                  & (audits["mechanisms"] != "[]")]
    return [tuple(m) for value in runs["mechanisms"] for m in json.loads(value)], int(len(runs))


def audit_report(audits: pd.DataFrame) -> list[str]:
    """The ledger report's section on the audits (Markdown lines)."""
    if not len(audits):
        return []
    lines = ["", "## Empirical audits (one-run, Steinke et al.)", "",
             "Each audit run repeats a release's mechanism with canaries under its own randomness; its bound is a "
             "lower bound on the epsilon the mechanism can satisfy at the audit's delta, at the stated confidence, "
             "never a guarantee. Its run read the task's data and is composed with the task's releases above.",
             "", "| backbone | task | method | target eps | audit | model | group | canaries | correct / guesses | "
                 "eps lower bound | claimed eps at audit delta |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in audits.itertuples():
        model = row.model if row.model == "individual" else f"merged ({row.operator})"
        lines.append(f"| {row.backbone} | {row.task} | {row.method} | {row.target_epsilon} | {row.audit} | {model} "
                     f"| {row.group} "
                     f"| {row.canaries} | {row.correct} / {row.guesses} | {row.epsilon_lb:.3f} | "
                     f"{row.recomputed_claim:.3f} |")
    return lines
