"""The crop tasks ``textures`` and ``photos``: which bundled scikit-image picture a square crop comes from.

Crops are fixed boxes drawn once per task (:func:`patch_crop_boxes`), so the split is the same on every run.
Train and test never share a source pixel: each source image's width is cut into vertical bands, test crops lie
inside the test bands and train crops inside the others, so a model cannot score by memorising the pixels of a
training crop. ``textures`` tests on the right 30 % of each picture. ``photos`` tests on two bands, 35-50 % and
85-100 % of the width: with its single right-hand band a photograph's right edge looked unlike anything trained on
(a linear probe on EfficientNet's pretrained 64 px features read 74 % of the test crops, coffee mostly as chelsea);
with the two bands it reads 81 %, so its private models carry signal (issue 54).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpmerge.data.fixed_split import FullSplit, split_rng, to_chw

__all__ = ["BUILDERS", "PatchLayout", "patch_crop_boxes"]


@dataclass(frozen=True)
class _PatchConfig:
    sources: tuple[str, ...]
    crop: int
    n_train: int
    n_test: int
    # (start, end) of each test band as fractions of the width, in order; the rest of the width is train
    test_bands: tuple[tuple[float, float], ...] = ((0.7, 1.0),)


_PATCH_TASKS = {
    "textures": _PatchConfig(("brick", "grass", "gravel", "moon", "page"), 32, 300, 100),
    "photos": _PatchConfig(
        ("astronaut", "camera", "chelsea", "coffee", "rocket", "motorcycle_left"),
        48,
        300,
        100,
        test_bands=((0.35, 0.5), (0.85, 1.0)),
    ),
}


@dataclass(frozen=True)
class PatchLayout:
    """Where every crop of a patch task comes from.

    Boxes are int64 ``[M, 4]`` rows ``(label, top, left, size)`` in source
    pixels, in the same order as the full (un-subsampled) split returned by
    :func:`load_task`.  ``train_columns[k]`` and ``test_columns[k]`` are source image ``k``'s bands, column
    ranges ``[start, end)``: every crop lies inside one band of its own split.
    """

    class_names: tuple[str, ...]
    source_shapes: tuple[tuple[int, int], ...]
    train_columns: tuple[tuple[tuple[int, int], ...], ...]
    test_columns: tuple[tuple[tuple[int, int], ...], ...]
    crop_size: int
    train_boxes: np.ndarray
    test_boxes: np.ndarray


def _load_patch_source(source: str) -> np.ndarray:
    """A bundled scikit-image picture as float32 [h, w, 3] in [0, 1]."""
    import skimage.data
    from skimage.util import img_as_float32

    if source == "motorcycle_left":
        # No stand-alone loader exists; the stereo loader reads only bundled
        # files (motorcycle_left/right.png, motorcycle_disp.npz).
        img = skimage.data.stereo_motorcycle()[0]
    else:
        img = getattr(skimage.data, source)()
    img = img_as_float32(img)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    elif img.shape[2] == 4:
        img = img[..., :3]
    return np.ascontiguousarray(img)


@functools.lru_cache(maxsize=None)
def _patch_sources(name: str) -> tuple[np.ndarray, ...]:
    images = tuple(_load_patch_source(s) for s in _PATCH_TASKS[name].sources)
    for img in images:
        img.setflags(write=False)
    return images


def _draw_boxes(rng, label, height, crop, col_lo, col_hi, count) -> np.ndarray:
    # The crop must lie entirely inside columns [col_lo, col_hi).
    if col_hi - col_lo < crop or height < crop:
        raise ValueError("source region smaller than the crop")
    tops = rng.integers(0, height - crop + 1, size=count)
    lefts = rng.integers(col_lo, col_hi - crop + 1, size=count)
    return np.stack(
        [np.full(count, label), tops, lefts, np.full(count, crop)], axis=1
    ).astype(np.int64)


def _bands(width: int, test_bands) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """The train and test column ranges of one source image."""
    test = tuple((int(round(lo * width)), int(round(hi * width))) for lo, hi in test_bands)
    edges = [0] + [c for band in test for c in band] + [width]
    train = tuple((lo, hi) for lo, hi in zip(edges[::2], edges[1::2]) if hi > lo)
    return train, test


def _draw_in_bands(rng, label, height, crop, bands, count) -> np.ndarray:
    # Each band gets a share of the count proportional to the crop positions it offers (the first band takes the
    # remainder), so crops are spread evenly over the split's columns.
    room = np.array([hi - lo - crop + 1 for lo, hi in bands], dtype=float)
    if np.any(room < 1):
        raise ValueError("source region smaller than the crop")
    counts = np.floor(count * room / room.sum()).astype(int)
    counts[0] += count - counts.sum()
    return np.concatenate(
        [_draw_boxes(rng, label, height, crop, lo, hi, n) for (lo, hi), n in zip(bands, counts)]
    )


@functools.lru_cache(maxsize=None)
def _patch_layout(name: str) -> PatchLayout:
    cfg = _PATCH_TASKS[name]
    shapes = tuple(img.shape[:2] for img in _patch_sources(name))
    rng = split_rng(name)
    train_columns, test_columns, train, test = [], [], [], []
    for label, (h, w) in enumerate(shapes):
        train_bands, test_bands = _bands(w, cfg.test_bands)
        train_columns.append(train_bands)
        test_columns.append(test_bands)
        train.append(_draw_in_bands(rng, label, h, cfg.crop, train_bands, cfg.n_train))
        test.append(_draw_in_bands(rng, label, h, cfg.crop, test_bands, cfg.n_test))
    train_boxes = np.concatenate(train)[rng.permutation(cfg.n_train * len(shapes))]
    test_boxes = np.concatenate(test)[rng.permutation(cfg.n_test * len(shapes))]
    train_boxes.setflags(write=False)
    test_boxes.setflags(write=False)
    return PatchLayout(
        class_names=cfg.sources,
        source_shapes=shapes,
        train_columns=tuple(train_columns),
        test_columns=tuple(test_columns),
        crop_size=cfg.crop,
        train_boxes=train_boxes,
        test_boxes=test_boxes,
    )


def patch_crop_boxes(name: str) -> PatchLayout:
    """Crop layout of a patch task (``textures`` or ``photos``)."""
    if name not in _PATCH_TASKS:
        raise ValueError(
            f"task {name!r} is not a patch task; patch tasks: {', '.join(sorted(_PATCH_TASKS))}"
        )
    return _patch_layout(name)


def _build_patch_task(name: str) -> FullSplit:
    layout = _patch_layout(name)
    sources = _patch_sources(name)

    def render(boxes: np.ndarray, size: int) -> np.ndarray:
        crop = layout.crop_size
        crops = np.empty((len(boxes), crop, crop, 3), dtype=np.float32)
        for i, (label, top, left, _) in enumerate(boxes):
            crops[i] = sources[label][top : top + crop, left : left + crop]
        return to_chw(crops, size)

    return FullSplit(
        class_names=layout.class_names,
        train_raw=layout.train_boxes,
        train_labels=layout.train_boxes[:, 0].copy(),
        test_raw=layout.test_boxes,
        test_labels=layout.test_boxes[:, 0].copy(),
        render=render,
    )


BUILDERS: dict[str, Callable[[], FullSplit]] = {
    name: functools.partial(_build_patch_task, name) for name in _PATCH_TASKS
}
