"""The crop tasks ``textures`` and ``photos``: which bundled scikit-image picture a square crop comes from.

Crops are fixed boxes drawn once per task (:func:`patch_crop_boxes`), so the split is the same on every run.
Train and test never share a source pixel: train crops lie in the left 70% of each source image, test crops in
the right 30%, so a model cannot score by memorising the pixels of a training crop.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpmerge.data.fixed_split import FullSplit, split_rng, to_chw

__all__ = ["BUILDERS", "PatchLayout", "patch_crop_boxes"]

_TRAIN_FRACTION_OF_WIDTH = 0.7


@dataclass(frozen=True)
class _PatchConfig:
    sources: tuple[str, ...]
    crop: int
    n_train: int
    n_test: int


_PATCH_TASKS = {
    "textures": _PatchConfig(("brick", "grass", "gravel", "moon", "page"), 32, 300, 100),
    "photos": _PatchConfig(
        ("astronaut", "camera", "chelsea", "coffee", "rocket", "motorcycle_left"), 48, 300, 100
    ),
}


@dataclass(frozen=True)
class PatchLayout:
    """Where every crop of a patch task comes from.

    Boxes are int64 ``[M, 4]`` rows ``(label, top, left, size)`` in source
    pixels, in the same order as the full (un-subsampled) split returned by
    :func:`load_task`.  ``split_cols[k]`` is the first column of source image
    ``k`` that belongs to the test region.
    """

    class_names: tuple[str, ...]
    source_shapes: tuple[tuple[int, int], ...]
    split_cols: tuple[int, ...]
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


def _draw_boxes(rng, label, height, width, crop, col_lo, col_hi, count) -> np.ndarray:
    # The crop must lie entirely inside columns [col_lo, col_hi).
    if col_hi - col_lo < crop or height < crop:
        raise ValueError("source region smaller than the crop")
    tops = rng.integers(0, height - crop + 1, size=count)
    lefts = rng.integers(col_lo, col_hi - crop + 1, size=count)
    return np.stack(
        [np.full(count, label), tops, lefts, np.full(count, crop)], axis=1
    ).astype(np.int64)


@functools.lru_cache(maxsize=None)
def _patch_layout(name: str) -> PatchLayout:
    cfg = _PATCH_TASKS[name]
    shapes = tuple(img.shape[:2] for img in _patch_sources(name))
    rng = split_rng(name)
    split_cols, train, test = [], [], []
    for label, (h, w) in enumerate(shapes):
        split = int(round(_TRAIN_FRACTION_OF_WIDTH * w))
        split_cols.append(split)
        train.append(_draw_boxes(rng, label, h, w, cfg.crop, 0, split, cfg.n_train))
        test.append(_draw_boxes(rng, label, h, w, cfg.crop, split, w, cfg.n_test))
    train_boxes = np.concatenate(train)[rng.permutation(cfg.n_train * len(shapes))]
    test_boxes = np.concatenate(test)[rng.permutation(cfg.n_test * len(shapes))]
    train_boxes.setflags(write=False)
    test_boxes.setflags(write=False)
    return PatchLayout(
        class_names=cfg.sources,
        source_shapes=shapes,
        split_cols=tuple(split_cols),
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
