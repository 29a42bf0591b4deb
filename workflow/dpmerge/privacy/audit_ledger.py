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

# What the ledger copies from each audit row as it is; its own columns follow in AUDIT_COLUMNS.
COPIED_FIELDS = ("backbone", "task", "method", "target_epsilon", "seed", "audit", "canaries", "included", "guesses",
                 "correct", "epsilon_lb", "auc", "auc_low", "auc_high", "auc_minus_rest", "auc_minus_rest_low",
                 "auc_minus_rest_high", "audit_delta", "claimed_epsilon_at_audit_delta", "verdict")
AUDIT_COLUMNS = ["path", *COPIED_FIELDS, "model", "operator", "group", "pooled_runs", "recomputed_claim",
                 "record_complete", "randomness", "mechanisms", "delta"]

# The claim recomputed from a record may differ from the audit's own number by float rounding only.
CLAIM_TOLERANCE = 1e-6


def _private(record: dict) -> bool:
    return record.get("accountant") is not None and record.get("method") != "nonprivate"


def claimed_epsilon(record: dict, delta: float) -> float:
    """The epsilon an audited run claims at the audit's `delta`, from what its record says ran (sigma, q, steps by
    queries), never from the configuration; infinite for a non-private run.

    A canary audit inserts or leaves out each canary, so what it can refute is the run's add/remove epsilon. The
    same Poisson-subsampled Gaussian steps have one whatever relation the run was calibrated for (q is fixed), and
    for them it is below the replace-one epsilon, so the audit is held to the smaller, stricter claim."""
    if not _private(record):
        return math.inf
    return composed_epsilon(record_mechanisms(record), float(delta), record["accountant"], "add_remove")


def build_audit_ledger(paths: list[str]) -> pd.DataFrame:
    """One row per audited model: every row of every audit file (`dpmerge audit`, `dpmerge audit-merge`,
    `dpmerge audit-pool`). A merged or pooled row runs no mechanism of its own: its claim is that of the audit
    runs it read, recomputed from their rows here."""
    return audit_ledger_of_rows([(path, pd.read_parquet(path).to_dict("records")) for path in paths])


def audit_ledger_of_rows(files: list[tuple[str, list[dict]]]) -> pd.DataFrame:
    """build_audit_ledger's table from each file's (path, rows), e.g. as the release log holds them."""
    rows = []
    for path, file_rows in files:
        for row in file_rows:
            pooled = json.loads(row["pooled_runs"]) if isinstance(row.get("pooled_runs"), str) else None
            derived = row.get("model") == "merged" or pooled is not None
            record = {} if derived else json.loads(row["privacy_record"])
            private = not derived and _private(record)
            rows.append({
                "path": str(path), **{field: row.get(field) for field in COPIED_FIELDS},
                "model": "merged" if row.get("model") == "merged" else "individual", "operator": row.get("operator"),
                "group": row.get("group") or "all",  # a group's row re-reads the same run: no mechanism of its own
                "pooled_runs": json.dumps(pooled) if pooled is not None else None,
                "recomputed_claim": (claimed_epsilon(record, row["audit_delta"]) if private else math.inf)
                if not derived else math.nan,
                "record_complete": derived or all(field in record for field in PRIVACY_FIELDS),
                "randomness": record.get("randomness"),
                "mechanisms": json.dumps(record_mechanisms(record)) if private and row.get("group", "all") == "all"
                else "[]",
                "delta": float(record["delta"]) if private else 0.0,
            })
    table = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
    runs: dict[tuple, list[float]] = {}
    for row in table[(table["model"] == "individual") & (table["group"] == "all") & table["pooled_runs"].isna()
                     ].itertuples():
        runs.setdefault(_run_key(row, row.task, row.seed), []).append(float(row.recomputed_claim))

    def claim_of(row, task, seed) -> float:  # NaN when the run is missing or audited twice: check_audits says so
        found = runs.get(_run_key(row, task, seed), [])
        return found[0] if len(found) == 1 else math.nan

    for index in table.index[(table["model"] == "merged") | table["pooled_runs"].notna()]:
        row = table.loc[index]
        if isinstance(row["pooled_runs"], str):
            parts = [name.rsplit("/s", 1) for name in json.loads(row["pooled_runs"])]
            claims = [claim_of(row, task, seed) for task, seed in parts]
        else:
            claims = [claim_of(row, row["task"], row["seed"])]
        table.loc[index, "recomputed_claim"] = max(claims) if not any(map(math.isnan, claims)) else math.nan
    return table


def _run_key(row, task, seed) -> tuple:
    """One audit run: its backbone, method, budget, kind, task and seed."""
    get = row.get if isinstance(row, pd.Series) else lambda field: getattr(row, field)
    return (get("backbone"), get("method"), float(get("target_epsilon")), get("audit"), str(task), int(seed))


def check_audits(audits: pd.DataFrame) -> list[str]:
    problems = []
    for row in audits.itertuples():
        where = f"{row.path} ({row.task}, {row.model}{' ' + row.operator if isinstance(row.operator, str) else ''})"
        if not row.record_complete:
            problems.append(f"{where}: the audit run's privacy record is incomplete")
            continue
        ran = row.model == "individual" and not isinstance(row.pooled_runs, str)  # a run, not a pool of runs
        if ran and row.method != "nonprivate" and row.randomness not in RNG_MODES:
            problems.append(f"{where}: the audit run's randomness {row.randomness!r} is not keyed by the study key")
        claim = float(row.recomputed_claim)
        if math.isnan(claim):
            problems.append(f"{where}: the audit runs it read are not in the ledger once each "
                            f"({row.pooled_runs or row.task}), so its claim cannot be recomputed")
            continue
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
        model += ", pooled" if isinstance(row.pooled_runs, str) else ""
        model += "" if getattr(row, "status", "current") == "current" else f" ({row.status}: from the release log)"
        lines.append(f"| {row.backbone} | {row.task} | {row.method} | {row.target_epsilon} | {row.audit} | {model} "
                     f"| {row.group} "
                     f"| {row.canaries} | {row.correct} / {row.guesses} | {row.epsilon_lb:.3f} | "
                     f"{row.recomputed_claim:.3f} |")
    return lines
