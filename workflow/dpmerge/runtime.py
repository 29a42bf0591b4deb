"""How a dpmerge process runs: allocator tuning, thread count, and the torchvision import fix.

Nothing here runs on `import dpmerge`; a command calls these where it starts (dpmerge.cli.main, the benchmarks,
the test session), and the model modules call :func:`make_torchvision_importable` before importing a library
that pulls torchvision in.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
import time

COMPUTE_MARK = "[compute]"


def make_torchvision_importable() -> None:
    """Declare torchvision's C++ op schemas when its compiled ops cannot load.

    The pinned torchvision wheel is a CUDA build; beside the CPU torch wheel its C ops fail to load, and
    `import torchvision` (pulled in by timm, open_clip and transformers' model classes) dies with
    "operator torchvision::nms does not exist" while registering fake kernels for those ops. We never call
    nms; declaring the schemas lets the import finish. Skipped when a working build already defines them.
    """
    import torch  # here, not at the top: the data modules call this without needing torch otherwise

    try:
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
        return
    except RuntimeError:
        pass
    lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - kept alive below
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    make_torchvision_importable.library = lib


def tune_allocator() -> None:
    """Stop glibc from returning freed blocks to the OS after every step.

    Per-sample gradients allocate and free tens of MB per layer per step; with glibc's defaults each one is
    a fresh mmap whose pages are zero-filled by the kernel, which measured here as 40% of a DP fine-tuning
    job's time (system time 15 s of 35 s; training 22 s -> 9.4 s with these settings, same results).
    Same effect as MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_/MALLOC_TOP_PAD_ in the environment.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    mallopt(m_mmap_threshold, 32 * 1024 * 1024)  # glibc's maximum
    mallopt(m_trim_threshold, 4 * 1024 * 1024 * 1024 - 1)
    mallopt(m_top_pad, 1024 * 1024 * 1024)


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, threads))


@functools.cache
def _glibc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def release_freed_memory() -> None:
    """Return freed heap memory to the system. glibc keeps freed blocks below its (adaptive, up to 32 MB) mmap
    threshold in the heap, so a stream of per-tensor temporaries leaves the resident set hundreds of MB above
    what is alive; measured on the merge benchmark this retention, not live tensors, set the peak."""
    trim = _glibc_malloc_trim()
    if trim is not None:
        trim(0)


def progress(done: int, total: int, started: float) -> str:
    """How far a long loop is: 'done/total, elapsed, rate and ETA', `started` from time.perf_counter()."""
    elapsed = time.perf_counter() - started
    rate = done / elapsed if elapsed > 0 else float("inf")
    eta = (total - done) / rate if rate > 0 else float("inf")
    return f"{done}/{total}, {elapsed:.1f}s, {rate:.2f}/s, eta {eta:.0f}s"


def compute_line(what: str, seconds: float) -> str:
    """The log line that states a job's own work, apart from start-up, loading and writing; bench/startup.py
    sums these against the job's wall time."""
    return f"{COMPUTE_MARK} {what}: {seconds:.3f} s"


@contextlib.contextmanager
def compute_section(what: str, log=None):
    """Time the block as the job's own work and log it (stderr unless `log` is given) when it finishes."""
    start = time.perf_counter()
    yield
    line = compute_line(what, time.perf_counter() - start)
    if log is None:
        print(line, file=sys.stderr, flush=True)
    else:
        log(line)
