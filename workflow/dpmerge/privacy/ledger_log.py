"""The ledger against the release log (privacy/release_log.py): every release file checked against what was logged
when it was written, and every logged release composed, whether or not its file is still on disk.

- A file whose tensors differ from the SHA-256 its own record carries was corrupted or edited after release.
- A fine-tune's file that the log does not hold, or holds with other tensors, was not written by this study's
  runs as it stands (edited, copied in, or its log deleted): the ledger cannot vouch for its record.
- A logged release whose file is gone, holds other tensors now, or is no longer in the workflow's grid still
  counts: it may have been published. Its row carries the record it was logged with and a status saying which.
"""

from __future__ import annotations

from pathlib import Path

from dpmerge.artifacts import POST_PROCESSING, RELEASE_HASH, file_tensors_sha256, read_metadata
from dpmerge.privacy.release_log import relative_path, results_folder

CURRENT = "current"  # the other statuses: replaced, deleted, outside the grid (`_status`)


def logged(meta: dict) -> bool:
    """Whether a file is a release the log must hold: a fine-tune's task vector (not a post-processing of a
    release, not a mixture or combination of releases, which their own stages write)."""
    return meta.get("artifact", "task_vector") == "task_vector" and not meta.get(POST_PROCESSING) \
        and "mixture" not in meta


def check_against_log(log: str | Path, entries: list[dict],
                      files: list[str]) -> tuple[list[str], list[tuple[str, dict, str]]]:
    """(problems, earlier releases) for the task-vector `files` the workflow lists, against the log's `entries`
    (`read_entries`): each file checked against the hash its record carries and against the log; every other
    logged task vector as (path, logged metadata, status), to be composed with the rest."""
    logged_hashes: dict[str, set[str]] = {}
    for entry in entries:
        for file in entry["files"]:
            logged_hashes.setdefault(file["path"], set()).add(file["tensors_sha256"])
    problems, current = [], set()
    for path in files:
        meta = read_metadata(path)
        if not logged(meta):
            continue
        if not Path(log).exists() and RELEASE_HASH not in meta:
            continue  # released before studies kept a log: nothing to check it against
        digest = file_tensors_sha256(path)
        recorded = meta.get(RELEASE_HASH)
        if recorded is not None and recorded != digest:
            problems.append(f"{path}: its tensors do not match the SHA-256 its record carries ({recorded[:12]}...): "
                            "the file was corrupted or edited after release; restore it from a backup or release "
                            "it again (the ledger keeps counting the first release)")
            continue
        name = relative_path(log, path)
        if name not in logged_hashes:
            problems.append(f"{path}: not in the study's release log ({log}): written outside this study's runs, "
                            "or the log was deleted (restore it from the backup kept with the key); its budget "
                            "cannot be vouched for")
        elif digest not in logged_hashes[name]:
            problems.append(f"{path}: its tensors match no release the log holds at this path: edited or replaced "
                            "outside dpmerge")
        current.add((name, digest))
    folder, earlier, seen = results_folder(log), [], set()
    for entry in entries:
        if "post_processing_of" in entry:
            continue  # a mixture or combination: a function of logged releases, which are composed already
        for file in entry["files"]:
            key = (file["path"], file["tensors_sha256"])
            if file.get("artifact") != "task_vector" or key in current or key in seen:
                continue
            seen.add(key)
            earlier.append((file["path"], entry["metadata"], _status(folder / file["path"], file["tensors_sha256"],
                                                                     file["path"], current)))
    return problems, earlier


def _status(on_disk: Path, digest: str, name: str, current: set) -> str:
    if any(path == name for path, _ in current):
        return "replaced"
    if not on_disk.is_file():
        return "deleted"
    try:
        same = file_tensors_sha256(on_disk) == digest
    except ValueError:
        same = False
    return "outside the grid" if same else "replaced"
