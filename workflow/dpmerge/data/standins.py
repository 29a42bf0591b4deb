"""Stand-ins for the paper's datasets: :func:`write_standin` writes a tiny random dataset in a real dataset's
on-disk layout, so paper.read_split reads it through the same code path as real data.

Tests and the CPU default pipeline (the `dpmerge make-standins` command) use them to exercise the paper's readers
end to end without the real data. Stand-in images and sentences carry a learnable class cue (a class colour and
stripe pattern; a class word), so a model trained on them must improve. :func:`standin_tokenizer_corpus` is the
public text the stand-in RoBERTa's tokenizer is trained on.
"""

from __future__ import annotations

import colorsys
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from dpmerge.data.paper import dataset_dir
from dpmerge.data.paper_glue import GLUE_COLUMNS, GLUE_LABELS, glue_splits
from dpmerge.data.paper_vision import EUROSAT_NAMES
from dpmerge.data.registry import GLUE_TASKS, PAPER_TASKS, TASKS

__all__ = ["write_standin", "standin_tokenizer_corpus"]


def write_standin(
    name: str,
    data_dir: str | Path,
    *,
    train_per_class: int = 4,
    test_per_class: int = 2,
    num_classes: int | None = None,
    image_size: int = 32,
    seed: int = 0,
) -> Path:
    """Write a tiny random dataset `name` under `data_dir` in the real dataset's layout; returns its folder.

    paper.read_split then reads it through the same code path as real data. Each class gets `train_per_class`
    training and `test_per_class` test examples, except EuroSAT, whose split is a fixed 80/10/10 cut of each
    class folder: it gets the fewest files per class giving at least those counts. `num_classes` (vision only)
    keeps stand-ins tiny; class names then come out of the real naming logic (folder names, or the first k
    hard-coded names). SUN397 and Stanford Cars take class names from data files, whose stand-in names are
    synthetic. `image_size` is the side of stand-in image files (wider than tall where the real photos vary in
    shape), except MNIST (28) and SVHN (32), whose file formats fix it. Refuses to write into an existing folder,
    which could hold real data.
    """
    if name not in PAPER_TASKS:
        raise ValueError(f"unknown paper task {name!r}; known: {', '.join(PAPER_TASKS)}")
    info = TASKS[name]
    data_dir = Path(data_dir)
    target = dataset_dir(name, data_dir)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not empty; write stand-ins into a fresh data directory")
    if name in GLUE_TASKS:
        if num_classes not in (None, info.num_classes):
            raise ValueError(f"{name}: GLUE label sets are fixed; num_classes must be None or {info.num_classes}")
    else:
        num_classes = info.num_classes if num_classes is None else num_classes
        if not 2 <= num_classes <= info.num_classes:
            raise ValueError(f"{name}: num_classes must be in 2..{info.num_classes}, got {num_classes}")
    if train_per_class < 1 or test_per_class < 1:
        raise ValueError("train_per_class and test_per_class must be at least 1")
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name in GLUE_TASKS:
        _write_glue(name, target, rng, train_per_class, test_per_class)
    else:
        _WRITERS[name](target, _Pixels(rng, num_classes, image_size), train_per_class, test_per_class)
    return target


class _Pixels:
    """Class-dependent stand-in images: a class colour (or grey level) times a class stripe pattern, plus noise."""

    def __init__(self, rng: np.random.Generator, num_classes: int, size: int):
        self.rng, self.num_classes, self.size = rng, num_classes, size

    def __call__(self, label: int, width: int = 0, height: int = 0, gray: bool = False) -> np.ndarray:
        width, height = width or self.size, height or self.size
        k = self.num_classes
        y, x = np.mgrid[0:height, 0:width].astype(np.float64)
        angle, period = np.pi * label / k, 3.0 + 2.0 * (label % 3)
        stripes = np.sin(2 * np.pi * (x * np.cos(angle) + y * np.sin(angle)) / period) > 0
        shade = 0.6 + 0.4 * stripes
        if gray:
            image = (50.0 + 180.0 * label / (k - 1)) * shade
        else:
            image = 255.0 * np.array(colorsys.hsv_to_rgb(label / k, 0.85, 0.95)) * shade[..., None]
        image += self.rng.normal(0.0, 10.0, image.shape)
        return np.clip(image, 0, 255).astype(np.uint8)

    def wide(self, label: int) -> np.ndarray:
        # Real photos in these datasets are rarely square; this exercises the centre crop.
        return self(label, width=self.size + self.size // 4)

    def labels(self, per_class: int) -> np.ndarray:
        labels = np.repeat(np.arange(self.num_classes), per_class)
        self.rng.shuffle(labels)
        return labels


def _save(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)  # format from the suffix: .jpg, .ppm


def _write_lines(path: Path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


def _write_sun397(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    images = root / "SUN397"
    # Synthetic class paths, every other one nested the way "/a/apartment_building/outdoor" is
    keys = [f"scene_{i:03d}" + ("/outdoor" if i % 2 else "") for i in range(pixels.num_classes)]
    _write_lines(images / "ClassName.txt", (f"/s/{key}" for key in keys))
    partitions: dict[str, list[str]] = {"Training_01.txt": [], "Testing_01.txt": []}
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    # One extra image per class lies outside partition 01, as most real SUN397 images do.
    for label in range(pixels.num_classes):
        for i, part in enumerate(["Training_01.txt"] * n_train + ["Testing_01.txt"] * n_test + [None]):
            entry = f"/s/{keys[label]}/sun_{''.join(pixels.rng.choice(letters, 12))}{i:04d}.jpg"
            _save(pixels.wide(label), images / entry.lstrip("/"))
            if part:
                partitions[part].append(entry)
    for file, entries in partitions.items():
        _write_lines(root / "Partitions" / file, entries)


def _write_cars(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    import scipy.io

    names = np.empty((1, pixels.num_classes), dtype=object)
    names[0, :] = [f"Standin Make Model{i:03d} Sedan 2012" for i in range(pixels.num_classes)]
    (root / "devkit").mkdir(parents=True)
    scipy.io.savemat(root / "devkit" / "cars_meta.mat", {"class_names": names})
    fields = ["bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname"]
    for mat, folder, per_class in (
        (root / "devkit" / "cars_train_annos.mat", root / "cars_train", n_train),
        (root / "cars_test_annos_withlabels.mat", root / "cars_test", n_test),
    ):
        labels = pixels.labels(per_class)
        records = np.empty((1, len(labels)), dtype=[(f, object) for f in fields])
        for i, label in enumerate(labels):
            fname = f"{i + 1:05d}.jpg"
            image = pixels.wide(label)
            _save(image, folder / fname)
            box = [np.array([[v]], dtype=np.uint16) for v in (1, 1, image.shape[1], image.shape[0])]
            records[0, i] = (*box, np.array([[label + 1]], dtype=np.uint8), np.array([fname]))
        scipy.io.savemat(mat, {"annotations": records})


def _write_resisc45(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    # torchgeo's class list; the real folders are exactly these names
    classes = sorted(_RESISC45_CLASSES)[: pixels.num_classes]
    lists: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for label, cls in enumerate(classes):
        for i, split in enumerate(["train"] * n_train + ["val"] + ["test"] * n_test):
            file = f"{cls}_{i + 1:03d}.jpg"
            _save(pixels(label), root / "NWPU-RESISC45" / cls / file)
            lists[split].append(file)
    for split, files in lists.items():
        _write_lines(root / f"resisc45-{split}.txt", files)


_RESISC45_CLASSES = (
    "airplane airport baseball_diamond basketball_court beach bridge chaparral church circular_farmland cloud "
    "commercial_area dense_residential desert forest freeway golf_course ground_track_field harbor "
    "industrial_area intersection island lake meadow medium_residential mobile_home_park mountain overpass palace "
    "parking_lot railway railway_station rectangular_farmland river roundabout runway sea_ice ship snowberg "
    "sparse_residential stadium storage_tank tennis_court terrace thermal_power_station wetland"
).split()


def _write_eurosat(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    per_class = n_train + 2 * n_test
    while per_class * 8 // 10 < n_train or per_class - per_class * 9 // 10 < n_test:
        per_class += 1
    for label, cls in enumerate(sorted(EUROSAT_NAMES)[: pixels.num_classes]):
        for i in range(per_class):
            _save(pixels(label), root / "2750" / cls / f"{cls}_{i + 1}.jpg")


def _write_svhn(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    import scipy.io

    root.mkdir(parents=True)
    for split, per_class in (("train", n_train), ("test", n_test)):
        labels = pixels.labels(per_class)
        x = np.stack([pixels(label, 32, 32) for label in labels], axis=-1)  # (32, 32, 3, n), as SVHN stores it
        y = np.where(labels == 0, 10, labels).astype(np.float64)[:, None]
        scipy.io.savemat(root / f"{split}_32x32.mat", {"X": x, "y": y})


def _write_idx(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _write_mnist(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    raw = root / "MNIST" / "raw"
    for prefix, per_class in (("train", n_train), ("t10k", n_test)):
        labels = pixels.labels(per_class)
        images = np.stack([pixels(label, 28, 28, gray=True) for label in labels])
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)


def _write_gtsrb(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    for label in range(pixels.num_classes):
        for i in range(n_train):
            # real names: <track>_<frame>.ppm
            _save(pixels.wide(label), root / "GTSRB" / "Training" / f"{label:05d}" / f"{i // 30:05d}_{i % 30:05d}.ppm")
    rows = []
    for i, label in enumerate(pixels.labels(n_test)):
        image = pixels.wide(label)
        _save(image, root / "GTSRB" / "Final_Test" / "Images" / f"{i:05d}.ppm")
        height, width = image.shape[:2]
        rows.append(f"{i:05d}.ppm;{width};{height};1;1;{width - 1};{height - 1};{label}")
    _write_lines(root / "GT-final_test.csv", ["Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId", *rows])


_DTD_CLASSES = (
    "banded blotchy braided bubbly bumpy chequered cobwebbed cracked crosshatched crystalline dotted fibrous "
    "flecked freckled frilly gauzy grid grooved honeycombed interlaced knitted lacelike lined marbled matted "
    "meshed paisley perforated pitted pleated polka-dotted porous potholed scaly smeared spiralled sprinkled "
    "stained stratified striped studded swirly veined waffled woven wrinkled zigzagged"
).split()


def _write_dtd(root: Path, pixels: _Pixels, n_train: int, n_test: int) -> None:
    base = root / "dtd"
    lists: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    # the literature trains on train1 + val1: spread the training images over both
    n_val = n_train // 2
    for label, cls in enumerate(_DTD_CLASSES[: pixels.num_classes]):
        for i, split in enumerate(["train"] * (n_train - n_val) + ["val"] * n_val + ["test"] * n_test):
            entry = f"{cls}/{cls}_{i + 1:04d}.jpg"
            _save(pixels.wide(label), base / "images" / entry)
            lists[split].append(entry)
    for split, entries in lists.items():
        _write_lines(base / "labels" / f"{split}1.txt", entries)


_WRITERS: dict[str, Callable[[Path, _Pixels, int, int], None]] = {
    "sun397": _write_sun397,
    "cars": _write_cars,
    "resisc45": _write_resisc45,
    "eurosat": _write_eurosat,
    "svhn": _write_svhn,
    "gtsrb": _write_gtsrb,
    "mnist": _write_mnist,
    "dtd": _write_dtd,
}

_FILLER = (
    "the a this one old small quiet bright little tall busy green river house garden road teacher child dog "
    "city letter window walks sees finds keeps opens paints near under behind across beside today again slowly"
).split()
# The word that makes a stand-in example's label learnable: one per class (stsb: one per whole score 0..5).
_CUES = ("amber", "cobalt", "violet", "scarlet", "olive", "silver")


def standin_tokenizer_corpus() -> list[str]:
    """Public text to train the stand-in RoBERTa's tokenizer on: the stand-in generator's own vocabulary (code
    constants), word by word and in pairs, never the generated training sentences, so no tokenizer merge is a
    statistic of a (stand-in) private training set."""
    words = [*_FILLER, *_CUES, "."]
    return [" ".join(words), *(f"{a} {b}" for a in words for b in words)]


def _write_glue(name: str, target: Path, rng: np.random.Generator, n_train: int, n_test: int) -> None:
    import datasets

    columns = GLUE_COLUMNS[name]
    if name == "stsb":
        label_feature, num_labels = datasets.Value("float32"), 6
    else:
        label_feature, num_labels = datasets.ClassLabel(names=list(GLUE_LABELS[name])), len(GLUE_LABELS[name])
    features = datasets.Features(
        {**{c: datasets.Value("string") for c in columns}, "label": label_feature, "idx": datasets.Value("int32")}
    )
    used: set[str] = set()

    def sentence(cue: str | None) -> str:
        while True:
            words = list(rng.choice(_FILLER, size=int(rng.integers(4, 8))))
            if cue:
                words.insert(int(rng.integers(0, len(words) + 1)), cue)
            text = " ".join(words) + " ."
            if text not in used:  # train and test must not share an example
                used.add(text)
                return text

    def split(per_class: int, labelled: bool = True) -> datasets.Dataset:
        classes = np.repeat(np.arange(num_labels), per_class)
        rng.shuffle(classes)
        rows: dict[str, list] = {c: [] for c in (*columns, "label", "idx")}
        for i, k in enumerate(classes):
            cue = _CUES[k]
            for j, column in enumerate(columns):
                rows[column].append(sentence(cue if j == len(columns) - 1 else None))
            score = min(5.0, k + float(rng.uniform(0.0, 0.6))) if name == "stsb" else int(k)
            rows["label"].append(score if labelled else (-1.0 if name == "stsb" else -1))
            rows["idx"].append(i)
        return datasets.Dataset.from_dict(rows, features=features)

    train, test = glue_splits(name)
    # GLUE's unlabelled test splits (label -1) are written too, as load_dataset does, and must stay unread.
    unlabelled = ["test_matched", "test_mismatched"] if name == "mnli" else ["test"]
    parts = {train: split(n_train), test: split(n_test)}
    if name == "mnli":
        parts["validation_mismatched"] = split(1)
    parts.update({part: split(1, labelled=False) for part in unlabelled})
    datasets.DatasetDict(parts).save_to_disk(str(target))
