"""One run per results folder. Snakemake locks its working directory, but two checkouts (or two working
directories) may point at one results folder; their jobs would then resume each other's checkpoints and overwrite
each other's releases. The Snakefile takes this lock, in the results folder itself, before the first job, and
holds it until the run ends (the lock is the open file: it goes away with the process, also after a crash).

Standard library only: the Snakefile imports it while it is parsed.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_NAME = "run.lock"
_held: list[int] = []  # the open descriptor of this process's lock, kept for the process's lifetime


class ResultsInUseError(Exception):
    pass


def lock_path(results: str | Path) -> Path:
    return Path(results) / "private" / LOCK_NAME


def acquire(results: str | Path) -> None:
    """Hold the results folder's lock for the rest of this process, or refuse naming the run that holds it."""
    if _held:
        return
    path = lock_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = Path(path).read_text().strip() or "another process"
        os.close(descriptor)
        raise ResultsInUseError(
            f"{results} is in use by another run ({holder}; lock {path}). Two runs on one results folder would "
            "resume each other's fine-tunes and overwrite each other's releases: wait for it to end, or give this "
            "run its own results folder (config `results:`). A lock outlives no process; if that run is gone "
            f"(it ran on another machine of a shared file system that lost it), delete {path}.") from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}, working directory {os.getcwd()}\n".encode())
    _held.append(descriptor)
