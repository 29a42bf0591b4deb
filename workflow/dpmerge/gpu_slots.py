"""Each running GPU job on a workstation sees only its own GPU.

Snakemake's local executor counts GPUs (`--resources gpu=N` bounds how many GPU jobs run at once) but never says
which one a job may use (snakemake#281), so every job would see all devices and start on device 0. Here the
workflow names a pool of device ids (`local_pool`: the first N of the CUDA_VISIBLE_DEVICES Snakemake itself was
started with, else 0..N-1) in DPMERGE_GPU_SLOTS; a job whose rule asked for a GPU (DPMERGE_GPU_JOB=1, set by
the rule's shell from `resources.gpu`) claims one free id from the pool before anything imports torch, and
runs with CUDA_VISIBLE_DEVICES set to it alone.

A claim is an exclusive `flock` on one lock file per device id, held by the job's `dpmerge` process until it
exits, so a killed or crashed job frees its GPU with no clean-up. The lock files are per user and per machine
(not per study), so two workflows started side by side share the pool instead of doubling up on a device.
Cluster executors are left alone: there the scheduler assigns devices (profiles/slurm).

Standard library only: `dpmerge.launch` calls `claim_for_job` before the fork server or torch is reached.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

SLOTS_VARIABLE = "DPMERGE_GPU_SLOTS"  # the pool, comma-separated device ids (the workflow sets it)
JOB_VARIABLE = "DPMERGE_GPU_JOB"  # "1" in the environment of a job whose rule asked for a GPU
POLL_SECONDS = 0.5

_held: list[int] = []  # the claimed lock's descriptor, kept open for the life of the process


class PoolError(ValueError):
    pass


def local_pool(gpus: int, visible: str | None) -> list[str]:
    """The device ids local GPU jobs share: the first `gpus` of `visible` (the CUDA_VISIBLE_DEVICES Snakemake
    runs under) when it is set, else 0..gpus-1. Empty when no GPU is granted."""
    if gpus <= 0:
        return []
    if visible is None or not visible.strip():
        return [str(i) for i in range(gpus)]
    ids = [part.strip() for part in visible.split(",") if part.strip()]
    if len(ids) < gpus:
        raise PoolError(f"--resources gpu={gpus} but CUDA_VISIBLE_DEVICES={visible!r} names {len(ids)} device(s); "
                        f"grant at most {len(ids)} GPUs or make more devices visible")
    return ids[:gpus]


def granted(resources: dict) -> int:
    """The `gpu` count Snakemake was given (--resources gpu=N), 0 if none; its values may be Resource objects."""
    value = resources["gpu"] if "gpu" in resources else 0
    value = getattr(value, "value", value)
    return int(value) if value is not None else 0


def lock_directory() -> Path:
    folder = Path(tempfile.gettempdir()) / f"dpmerge-gpu-slots-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def claim(pool: list[str], folder: Path | None = None, log=None) -> str:
    """One device id of `pool` no other live process holds, waiting while all are taken. The claim lasts until
    this process exits."""
    if not pool:
        raise PoolError(f"{SLOTS_VARIABLE} names no device")
    folder = lock_directory() if folder is None else folder
    waited = False
    while True:
        for device in pool:
            descriptor = os.open(folder / f"gpu-{device}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                continue
            _held.append(descriptor)
            return device
        if not waited and log is not None:
            log(f"[gpu] every GPU of the pool {','.join(pool)} is in use; waiting for one")
        waited = True
        time.sleep(POLL_SECONDS)


def claim_for_job(environ=os.environ, log=None) -> str | None:
    """For a GPU job with a pool: claim a device and make it the only one the job sees. Returns the device id,
    or None where there is nothing to do (a CPU job, no pool, or a claim already made in this process)."""
    pool = [part for part in environ.get(SLOTS_VARIABLE, "").split(",") if part]
    if environ.get(JOB_VARIABLE) != "1" or not pool or _held:
        return None
    device = claim(pool, log=log)
    environ["CUDA_VISIBLE_DEVICES"] = device
    if log is not None:
        log(f"[gpu] this job runs on GPU {device} (CUDA_VISIBLE_DEVICES={device}; pool {','.join(pool)})")
    return device


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
