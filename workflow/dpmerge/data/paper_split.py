"""What reading one of the paper's datasets gives (:class:`PaperSplit`), how its images become pixels, and the
error for data that is not there (:class:`MissingDataError`).

Nothing here decodes an image until asked: the readers (paper_vision.py, paper_glue.py) return cheap per-example
references (file paths, or row numbers into MNIST's idx and SVHN's .mat arrays, :class:`ArrayRefs`) and
:meth:`PaperSplit.render` turns a chunk of them into pixels with CLIP's evaluation crop (Radford et al.,
"Learning Transferable Visual Models From Natural Language Supervision", arXiv:2103.00020), so a 100k-image
training set never sits in memory at once.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image

from dpmerge.data.registry import TASKS

__all__ = ["MissingDataError", "require_paths", "ArrayRefs", "PaperSplit", "idx_array"]


class MissingDataError(FileNotFoundError):
    """A dataset's files are not where :func:`read_split` looks; the message says where and how to get them."""

    def __init__(self, name: str, path: Path, data_dir: Path, problem: str = "not found"):
        super().__init__(
            f"{name}: {problem}: {path}\n"
            f"  expected under {data_dir}: {TASKS[name].layout}\n"
            f"  prepare it with `dpmerge prepare-data --task {name} --data-dir {data_dir}` (needs network), "
            f"or put the files there in that layout."
        )


def require_paths(name: str, data_dir: Path, *paths: Path) -> None:
    for path in paths:
        if not path.exists():
            raise MissingDataError(name, path, data_dir)


@dataclass(frozen=True, eq=False)
class ArrayRefs:
    """Rows of an image array stored in one file (MNIST idx, SVHN .mat), indexable like a numpy array.

    Holds row numbers only, so a 73k-image split costs 0.6 MB until rendered. Any index (int, slice, integer
    array, mask) gives ArrayRefs again, an int a one-row one.
    """

    path: str
    fmt: str  # "idx" | "svhn"
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key) -> ArrayRefs:
        return ArrayRefs(self.path, self.fmt, np.atleast_1d(self.rows[key]))


@dataclass(frozen=True, eq=False)
class PaperSplit:
    class_names: tuple[str, ...]
    train_refs: object  # numpy object array of paths or texts ((n, 2) for pairs), or ArrayRefs
    train_labels: np.ndarray  # int64; float32 for stsb
    test_refs: object
    test_labels: np.ndarray
    input_kind: str  # "image" | "single" | "pair": how render reads refs

    def render(self, refs, image_size: int):
        """Inputs for a chunk of refs (pass chunks: a whole training set of images would not fit in memory).

        Images come out as uint8 [n, 3, S, S], RGB: the shorter side resized to S with bicubic resampling, then
        the centre S x S crop, as CLIP's evaluation transform does before normalising; grayscale is repeated to
        three channels. Text comes out as a list of strings, or of (first, second) pairs; image_size is ignored.
        """
        if self.input_kind == "single":
            return [str(text) for text in refs]
        if self.input_kind == "pair":
            return [(str(first), str(second)) for first, second in refs]
        out = np.empty((len(refs), 3, image_size, image_size), dtype=np.uint8)
        for i, image in enumerate(_images(refs)):
            out[i] = np.asarray(_resize_center_crop(image, image_size)).transpose(2, 0, 1)
        return out


def _resize_center_crop(image: Image.Image, size: int) -> Image.Image:
    # The arithmetic of torchvision's Resize(size, BICUBIC) + CenterCrop(size) on PIL images, which CLIP's
    # preprocessing is: the long side is truncated, the crop offset rounded.
    width, height = image.size
    if width <= height:
        new_w, new_h = size, int(size * height / width)
    else:
        new_w, new_h = int(size * width / height), size
    image = image.resize((new_w, new_h), Image.BICUBIC)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def _images(refs) -> Iterator[Image.Image]:
    if isinstance(refs, ArrayRefs):
        pixels = _mnist_pixels(refs.path) if refs.fmt == "idx" else _svhn_pixels(refs.path, _stamp(refs.path))
        for row in refs.rows:
            # torchvision hands MNIST out as mode "L" and SVHN as HWC RGB; both become RGB here
            yield Image.fromarray(np.ascontiguousarray(pixels[row])).convert("RGB")
        return
    for path in refs:
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB")
        except OSError as error:
            raise ValueError(f"{path}: not a readable image ({error})") from error
        yield rgb


def _stamp(path) -> tuple[str, int, int]:
    # Part of a cache key, so that a file replaced at the same path (re-downloaded, rewritten) is read afresh.
    stat = os.stat(path)
    return str(path), stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=2)
def _svhn_pixels(path: str, stamp: tuple) -> np.ndarray:
    # One decoded .mat per split (train: 225 MB) is kept so that rendering chunk after chunk reads it once.
    import scipy.io

    return scipy.io.loadmat(path, variable_names=["X"])["X"].transpose(3, 0, 1, 2)


def idx_array(path: Path, ndim: int) -> np.ndarray:
    """An unsigned-byte idx file (the format torchvision's MNIST reads) as a read-only memory map."""
    header = 4 + 4 * ndim
    with open(path, "rb") as handle:
        head = handle.read(header)
    if len(head) < header or head[:2] != b"\0\0" or head[2] != 0x08 or head[3] != ndim:
        raise ValueError(f"{path}: not an unsigned-byte idx file with {ndim} dimension(s)")
    dims = struct.unpack(f">{ndim}I", head[4:])
    size, expected = path.stat().st_size, header + int(np.prod(dims))
    if size != expected:
        raise ValueError(f"{path}: {size} bytes, but its header {dims} needs {expected} (truncated or corrupt)")
    return np.memmap(path, dtype=np.uint8, mode="r", offset=header, shape=dims)


def _mnist_pixels(path: str) -> np.ndarray:
    return idx_array(Path(path), 3)
