"""The ledger against the release log (privacy/release_log.py): every release file checked against what was logged
when it was written, and every logged release composed, whether or not its file is still on disk.

- A file whose tensors differ from the SHA-256 its own record carries was corrupted or edited after release.
- A fine-tune's file that the log does not hold, or holds with other tensors, was not written by this study's
  runs as it stands (edited, copied in, or its log deleted): the ledger cannot vouch for its record.
- A logged release whose file is gone, holds other tensors now, or is no longer in the workflow's grid still
  counts: it may have been published. Its row carries the record it was logged with and a status saying which.

The same holds for the other logged releases of a task's data: private merge statistics (the ledger's statistics
table) and audit runs' rows (its audit table), each composed into its task's budget from what the log holds.
"""

from __future__ import annotations

from pathlib import Path

from dpmerge.artifacts import POST_PROCESSING, RELEASE_HASH, file_tensors_sha256, read_metadata
from dpmerge.privacy.release_log import file_sha256, logged_hash, relative_path, results_folder

CURRENT = "current"  # the other statuses: replaced, deleted, outside the grid (`_status`)


# What the log holds: a fine-tune's task vector, a private merge statistic's file, an audit run's rows. The hash
# each is logged with: of its tensors, or of its bytes for the audit's Parquet rows.
LOGGED_ARTIFACTS = ("task_vector", "merge_statistics", "audit")


def logged(meta: dict) -> bool:
    """Whether a task-vector file is a release the log must hold: a fine-tune's (not a post-processing of a
    release, not a mixture or combination of releases, which their own stages write)."""
    return meta.get("artifact", "task_vector") == "task_vector" and not meta.get(POST_PROCESSING) \
        and "mixture" not in meta


def check_against_log(log: str | Path, entries: list[dict], files: list[str],
                      artifact: str = "task_vector") -> tuple[list[str], list[tuple[str, dict, str]]]:
    """(problems, earlier releases) for the `files` of one logged `artifact` the workflow lists, against the log's
    `entries` (`read_entries`): each file checked against the hash its record carries and against the log; every
    other logged release of that artifact as (path, logged metadata, status), to be composed with the rest.
    Public statistics release no private data and are not logged; nor are merged or pooled audits, which read only
    kept runs."""
    logged_hashes = _logged_hashes(entries, artifact)
    problems, current = [], set()
    for path in files:
        recorded = _recorded_hash(log, artifact, path)
        if recorded is None:
            continue
        digest = _digest(artifact, path)
        if recorded and recorded != digest:
            problems.append(f"{path}: its tensors do not match the SHA-256 its record carries ({recorded[:12]}...): "
                            "the file was corrupted or edited after release; restore it from a backup or release "
                            "it again (the ledger keeps counting the first release)")
            continue
        name = relative_path(log, path)
        if name not in logged_hashes:
            problems.append(f"{path}: not in the study's release log ({log}): written outside this study's runs, "
                            "or the log was deleted (restore it from the backup kept with the key); its budget "
                            "cannot be vouched for" + ("" if artifact == "task_vector" else
                                                       ". Made before its kind was logged? Run it again in this "
                                                       "results folder: the same run is the same release, logged"))
        elif digest not in logged_hashes[name]:
            problems.append(f"{path}: its content matches no release the log holds at this path: edited or replaced "
                            "outside dpmerge")
        current.add((name, digest))
    return problems, [(path, entry["metadata"], status)
                      for path, entry, status in earlier_logged(log, entries, artifact, current)]


def _recorded_hash(log: str | Path, artifact: str, path: str | Path) -> str | None:
    """The hash a file carries of its own content ('' where it carries none: an audit's rows), or None where the
    file is not checked against the log: not a logged kind of release, or made before releases were logged."""
    if artifact == "audit":
        return "" if is_audit_run(path) else None
    meta = read_metadata(path)
    if artifact == "merge_statistics":
        return meta.get(RELEASE_HASH) if meta.get("source") == "private" else None
    if not logged(meta) or (not Path(log).exists() and RELEASE_HASH not in meta):
        return None
    return meta.get(RELEASE_HASH, "")


def is_audit_run(path: str | Path) -> bool:
    """Whether an audit file holds a run's rows (`dpmerge audit`), not a merged or pooled audit of kept runs."""
    import pandas as pd

    rows = pd.read_parquet(path)
    pooled = rows["pooled_runs"].notna().any() if "pooled_runs" in rows else False
    merged = (rows["model"] == "merged").any() if "model" in rows else False
    return not pooled and not merged


def earlier_logged(log: str | Path, entries: list[dict], artifact: str,
                   current: set) -> list[tuple[str, dict, str]]:
    """(path, entry, status) for each logged release of `artifact` that is not among the `current` (path, hash)
    pairs: its file is gone, replaced or no longer listed. Each (path, hash) once: the same run made again after
    its file was deleted is the same release. An audit's rows are composed once per run (mechanism): its bound
    at another delta or confidence post-processes the same run's scores. Mixtures and combinations
    (`post_processing_of`) are functions of logged releases, which are composed already."""
    folder, earlier, seen = results_folder(log), [], set()
    if artifact == "audit":
        seen = {entry["mechanism"] for entry in entries for file in entry["files"]
                if (file["path"], logged_hash(file)) in current}
    for entry in entries:
        if "post_processing_of" in entry:
            continue
        for file in entry["files"]:
            key = (file["path"], logged_hash(file))
            run = entry["mechanism"] if artifact == "audit" else key
            if file.get("artifact") != artifact or key in current or run in seen:
                continue
            seen.add(run)
            earlier.append((file["path"], entry, _status(artifact, folder / file["path"], key[1], file["path"],
                                                         current)))
    return earlier


def _logged_hashes(entries: list[dict], artifact: str) -> dict[str, set[str]]:
    hashes: dict[str, set[str]] = {}
    for entry in entries:
        for file in entry["files"]:
            if file.get("artifact") == artifact:
                hashes.setdefault(file["path"], set()).add(logged_hash(file))
    return hashes


def _digest(artifact: str, path: str | Path) -> str:
    return file_sha256(path) if artifact == "audit" else file_tensors_sha256(path)


def _status(artifact: str, on_disk: Path, digest: str, name: str, current: set) -> str:
    if any(path == name for path, _ in current):
        return "replaced"
    if not on_disk.is_file():
        return "deleted"
    try:
        same = _digest(artifact, on_disk) == digest
    except (ValueError, OSError):
        same = False
    return "outside the grid" if same else "replaced"
