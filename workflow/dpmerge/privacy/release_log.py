"""The release log: every release a study ever wrote, appended before its files are published, never rewritten.

A release is forever: once written it may be published, so the ledger composes every release ever made from a
dataset, also one whose file was overwritten or deleted since. Snakemake deletes a job's old outputs before it
reruns the job, and people delete files; neither touches this log, which lives beside the study key in
`<results>/private/releases.jsonl` (mode 0600 in the 0700 folder: it holds keyed tags, and it is where a study's
history is kept, not a release).

One line per run that releases: a fine-tune's task vector and head (one mechanism); a private merge statistic's
file (one mechanism per task); an audit run's rows (its bound is computed from a run on the task's data); a
mixture or combination, marked as post-processing of the releases it is a function of. Each line holds its files
(path relative to the results folder, SHA-256 of the tensors, or of the bytes for an audit's Parquet rows), the
metadata the files carry (privacy records, backbone, task) and the run's mechanism tag
(`study_key.mechanism_fingerprint` of its full identity, keyed, so it says nothing without the key). The same
identity under the same key draws the same randomness and writes the same content: a run repeated after its files
were deleted is the same release, logged again and composed once. A run of another identity at a path the log
already holds is a new release of the same data; it is refused unless the study allows replacing
(`privacy.replace_releases`, `--replace-release`), and then the earlier release stays in the log and in the
composition.

What the log cannot do: it remembers only what this results folder's runs wrote. A user who deletes or edits
the log (or the whole results folder) erases that memory, and the ledger then composes only what remains.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

LOG_NAME = "releases.jsonl"


class ReleaseLogError(ValueError):
    pass


def release_log_path(study_key: str | Path) -> Path:
    """The log of the study whose key is at `study_key` (`<results>/private/study.key`): beside the key."""
    return Path(study_key).parent / LOG_NAME


def results_folder(log: str | Path) -> Path:
    return Path(log).parent.parent


def relative_path(log: str | Path, path: str | Path) -> str:
    """A release's path as the log names it: relative to the results folder, so a moved folder keeps its log."""
    return os.path.relpath(Path(path).resolve(), results_folder(log).resolve())


def read_entries(log: str | Path) -> list[dict]:
    """Every entry of the log in the order written (none where there is no log yet). A line that is not a whole
    JSON entry is refused naming the line: a log is never repaired silently."""
    log = Path(log)
    if not log.exists():
        return []
    entries = []
    with open(log, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
                    raise ValueError("not an entry")
            except ValueError:
                raise ReleaseLogError(f"{log}, line {number}: not a release-log entry; the log is append-only and "
                                      "written by dpmerge alone: restore it from your backup") from None
            entries.append(entry)
    return entries


def earlier_releases_at(log: str | Path, paths: list[str | Path], mechanism: str) -> list[tuple[str, dict]]:
    """(path, entry) for every logged release at one of `paths` made by another mechanism than `mechanism`
    (mixtures and combinations, post-processing of logged releases, spend nothing of their own)."""
    wanted = {relative_path(log, path) for path in paths}
    return [(file["path"], entry) for entry in read_entries(log) if entry.get("mechanism") != mechanism
            and "post_processing_of" not in entry for file in entry["files"] if file["path"] in wanted]


def check_replacement(log: str | Path, paths: list[str | Path], mechanism: str, *, allowed: bool) -> None:
    """Refuse to release at a path where the log holds a release of another mechanism, unless replacing is
    allowed: the earlier release may already be published, and its budget is spent whatever happens to its file."""
    earlier = earlier_releases_at(log, paths, mechanism)
    if earlier and not allowed:
        path, entry = earlier[0]
        record = entry.get("metadata", {})
        what = ", ".join(f"{key} {record[key]}" for key in ("method", "target_epsilon", "seed") if key in record)
        raise ReleaseLogError(
            f"{path} was released before by another run ({what}; {len(earlier)} earlier release(s) at these paths, "
            f"logged in {log}). A release is forever: the earlier one counts in its dataset's budget "
            "even once its file is replaced. To release again anyway, set privacy: {replace_releases: true} (or "
            "pass --replace-release); the ledger then composes both. To keep the earlier release, restore the "
            "configuration it was made with, or write to another results folder.")


def append(log: str | Path, *, mechanism: str, files: list[dict], metadata: dict, settings: dict | None = None,
           post_processing_of: list[str] | None = None) -> None:
    """Append one release to the log, durably (fsync), under an exclusive lock: parallel jobs of one study write
    whole lines. Called before the release's files are renamed into place, so a published file is always logged."""
    log = Path(log)
    if not log.parent.exists():
        log.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(log.parent, 0o700)
    entry = {"mechanism": mechanism, "files": files, "metadata": metadata}
    if settings is not None:
        entry["settings"] = settings
    if post_processing_of is not None:
        entry["post_processing_of"] = post_processing_of
    line = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str) + "\n"
    descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        data = line.encode()
        while data:
            written = os.write(descriptor, data)
            data = data[written:]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish(log: str | Path, *, mechanism: str, record: dict, where: dict,
            files: list[tuple[str | Path, dict, str]], settings: dict | None = None,
            post_processing_of: list[str | Path] | None = None) -> None:
    """Release one run's files: each (path, tensors, artifact) with the run's record, `where` (backbone, task)
    and the SHA-256 of its own tensors in its metadata, logged first, then written (each atomically). `settings`
    (the run's settings as the workflow gave them) are logged too, for `changed_settings`. `post_processing_of`:
    the logged releases a mixture or combination is a function of; its entry is kept (its files are checked like
    any release's) but never composed, since those releases are composed already."""
    from dpmerge.artifacts import check_privacy_record, save_released, tensors_sha256

    check_privacy_record(record, str(files[0][0]))
    hashes = [tensors_sha256(tensors) for _, tensors, _ in files]
    sources = None if post_processing_of is None else [relative_path(log, path) for path in post_processing_of]
    append(log, mechanism=mechanism, metadata={**record, **where}, settings=settings, post_processing_of=sources,
           files=[{"path": relative_path(log, path), "artifact": artifact, "tensors_sha256": digest}
                  for (path, _, artifact), digest in zip(files, hashes)])
    for path, tensors, artifact in files:
        save_released(path, tensors, record, {**where, "artifact": artifact})  # its metadata carries the same hash


def publish_tensors(log: str | Path, *, mechanism: str, path: str | Path, tensors: dict, metadata: dict,
                    artifact: str, settings: dict | None = None) -> None:
    """Release one file of tensors that is no fine-tune (a private merge statistic): logged first with the SHA-256
    of its tensors and its metadata (which holds its privacy records), then written with the same hash in its own
    metadata, which every reader checks."""
    from dpmerge.artifacts import RELEASE_HASH, save_tensors, tensors_sha256

    append(log, mechanism=mechanism, metadata=metadata, settings=settings,
           files=[{"path": relative_path(log, path), "artifact": artifact, "tensors_sha256": tensors_sha256(tensors)}])
    save_tensors(path, tensors, {**metadata, RELEASE_HASH: ""})


def publish_file(log: str | Path, *, mechanism: str, path: str | Path, write, metadata: dict, artifact: str,
                 settings: dict | None = None) -> None:
    """Release one file that is not tensors (an audit's rows): `write(tmp)` writes it to a temporary file, whose
    bytes' SHA-256 is logged with `metadata` before the file is renamed into place. The log's metadata must hold
    everything the ledger composes, since the file may be gone when the ledger runs."""
    from dpmerge.artifacts import atomic_write

    def logged(tmp):
        write(tmp)
        append(log, mechanism=mechanism, metadata=metadata, settings=settings,
               files=[{"path": relative_path(log, path), "artifact": artifact, "sha256": file_sha256(tmp)}])

    atomic_write(path, logged)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (a release that is not tensors: its bytes are its content)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def logged_hash(file: dict) -> str:
    """The hash a log entry's file was released with: of its tensors, or of its bytes where it holds no tensors."""
    return file.get("tensors_sha256") or file.get("sha256", "")


# Where the weights and the job are, not what they are (the weights' hash is in the identity already): moving a
# checkpoint file or running on another device draws the same randomness and makes the same release.
LOCATION_SETTINGS = ("checkpoint", "cache_dir", "device")


def backbone_settings(backbone_spec: dict) -> dict:
    """The backbone's settings that define a fine-tune's mechanism (image size, trainable blocks, precision, ...):
    part of its randomness identity and of its logged settings."""
    return {k: v for k, v in sorted(backbone_spec.items()) if k not in LOCATION_SETTINGS}


def run_settings(*, method: str, epsilon: float | None, seed: int, hparams: dict, backbone_settings: dict) -> dict:
    """A fine-tune's settings as the workflow gives them to `dpmerge finetune`, in one comparable form: what the
    Snakefile plans and what the stage logs, so that a changed setting is seen before any job runs."""
    return json.loads(json.dumps({"method": method, "epsilon": None if epsilon is None else float(epsilon),
                                  "seed": int(seed), "hparams": hparams, "backbone": backbone_settings},
                                 sort_keys=True, default=str))


def statistics_settings(*, kind: str, examples: int, clip_norm: float, epsilon: float) -> dict:
    """A private merge statistic's settings as the workflow gives them to `dpmerge statistics`, in one comparable
    form (the task vectors it reads are in its identity too, and their own settings are the fine-tunes')."""
    return {"statistic": {"kind": kind, "examples": int(examples), "clip_norm": float(clip_norm),
                          "epsilon": float(epsilon)}}


def audit_run_settings(run: dict, *, kind: str, canaries: int, groups: dict | None) -> dict:
    """An audit run's settings: the fine-tune's (`run_settings`) and what makes it an audit (its kind, how many
    canaries, and a black-box audit's groups, which choose its canaries). The delta and confidence its bound is
    stated at are not: they post-process the run's scores, the same run."""
    return json.loads(json.dumps({**run, "audit": {"kind": kind, "canaries": int(canaries), "groups": groups or {}}},
                                 sort_keys=True, default=str))


def changed_settings(log: str | Path, planned: dict[str, dict]) -> list[tuple[str, list[str]]]:
    """(path, what differs) for each planned release (path -> run_settings, statistics_settings or
    audit_run_settings) whose latest logged release
    at that path was made with other settings; paths the log does not hold, or holds without settings, are new."""
    latest: dict[str, dict] = {}
    for entry in read_entries(log):
        if "settings" in entry:
            for file in entry["files"]:
                latest[file["path"]] = entry["settings"]
    changed = []
    for path, settings in planned.items():
        before = latest.get(relative_path(log, path))
        if before is not None and before != settings:
            changed.append((path, _differences(before, settings)))
    return changed


def _differences(before: dict, after: dict, prefix: str = "") -> list[str]:
    found = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            found.append(f"{prefix}{key} {old!r} -> {new!r}")
    return found
