"""The privacy ledger of a study. Rule: privacy_ledger: every released task vector's record and every merge
statistic's, collected into Parquet tables and a report, and checked against their budgets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dpmerge.artifacts import PRIVACY_FIELDS, atomic_write, read_metadata
from dpmerge.privacy.audit_ledger import audit_ledger_of_rows, build_audit_ledger, check_audits
from dpmerge.privacy.ledger import (
    build_ledger,
    build_statistics_ledger,
    check_ledger,
    check_statistics,
    ledger_check,
    ledger_of_records,
    ledger_report,
    statistics_of_records,
)
from dpmerge.privacy.ledger_log import CURRENT, LOGGED_ARTIFACTS, check_against_log
from dpmerge.privacy.release_log import read_entries
from dpmerge.stages.common import log, recorded_paths


def ledger(*, task_vectors: list[str], out: str, report: str, statistics: list[str] | None = None,
           statistics_out: str | None = None, check_out: str | None = None, audits: list[str] | None = None,
           audits_out: str | None = None, release_log: str | None = None) -> None:
    """Write the ledger (and the statistics' ledger), the report and the check's verdict (`check_out`, JSON),
    then fail if any check failed: report and verdict are written either way, so a failed check can be read.
    Every table names its files relative to the results folder (`recorded_paths`), never by absolute paths.

    With `release_log` (the study's, privacy/release_log.py), every file is checked against it and every logged
    release whose file is gone, replaced or out of the grid is composed too, with its status."""
    for path in task_vectors:
        if not any(field in read_metadata(path) for field in PRIVACY_FIELDS):
            raise ValueError(f"{path} carries no privacy record: the ledger checks releases ('dpmerge finetune', "
                             "'dpmerge mix' or 'dpmerge combine' write them); plain task vectors can still be merged "
                             "('dpmerge merge') and measured ('dpmerge drift')")
    table = build_ledger(task_vectors)
    log_problems, earlier, logged_runs = [], {kind: [] for kind in LOGGED_ARTIFACTS}, None
    if release_log is not None:
        entries = read_entries(release_log)  # a ReleaseLogError is a ValueError: one line from the CLI
        for kind, files in zip(LOGGED_ARTIFACTS, (task_vectors, statistics or [], audits or [])):
            problems, earlier[kind] = check_against_log(release_log, entries, files, kind)
            log_problems += problems
        logged_runs = len(entries)
    statistics_table = with_earlier(build_statistics_ledger(statistics or []), earlier["merge_statistics"],
                                    statistics_of_records)
    audit_table = with_earlier(build_audit_ledger(audits or []), earlier["audit"],
                               lambda logged: audit_ledger_of_rows([(path, meta["rows"]) for path, meta in logged]))
    inputs = [*task_vectors, *(statistics or []), *(audits or [])]
    named = dict(zip(inputs, recorded_paths(inputs, [p for p in (out, report, statistics_out, check_out,
                                                                   audits_out) if p])))
    for frame in (table, statistics_table, audit_table):  # logged releases are named as the log names them
        frame["path"] = [named.get(path, path) for path in frame["path"]]
    table = with_earlier(table, earlier["task_vector"], ledger_of_records)
    if "tensors_sha256" in table:
        table["tensors_sha256"] = table["tensors_sha256"].fillna("")
    problems = log_problems + check_ledger(table) + check_statistics(statistics_table, table) + \
        check_audits(audit_table)
    atomic_write(out, lambda tmp: table.to_parquet(tmp, index=False))
    if statistics_out:
        atomic_write(statistics_out, lambda tmp: statistics_table.to_parquet(tmp, index=False))
    if audits_out:
        atomic_write(audits_out, lambda tmp: audit_table.to_parquet(tmp, index=False))
    atomic_write(report, lambda tmp: Path(tmp).write_text(ledger_report(table, problems, statistics_table,
                                                                        audit_table, logged_runs)))
    if check_out:
        verdict = ledger_check(table, problems, statistics_table, audit_table)
        atomic_write(check_out, lambda tmp: Path(tmp).write_text(json.dumps(verdict, indent=1) + "\n"))
    if problems:
        raise ValueError("privacy ledger check failed:\n  " + "\n  ".join(problems))
    log(f"[ledger] {len(table)} released task vectors, all within budget")


def with_earlier(table: pd.DataFrame, earlier: list[tuple[str, dict, str]], build) -> pd.DataFrame:
    """`table` (its files, status current) and the rows `build` makes of the release log's earlier releases
    ((path, logged metadata, status): gone, replaced or outside the grid), each with its status. A task vector is
    one row, built all at once (each distinct mechanism is accounted once); a statistics or audit file is several."""
    table["status"] = CURRENT
    if not earlier:
        return table
    if build is ledger_of_records:
        logged = build([(path, metadata) for path, metadata, _ in earlier])
        logged["status"] = [status for *_, status in earlier]
    else:
        logged = pd.concat([build([(path, metadata)]).assign(status=status) for path, metadata, status in earlier],
                           ignore_index=True)
    return pd.concat([table, logged], ignore_index=True)
