"""Readers of the paper's eight vision datasets, in the layouts torchvision's dataset classes (and, for
RESISC45, torchgeo's) write, with the train/test split the task-vector literature uses (Ilharco et al., "Editing
Models with Task Arithmetic", arXiv:2212.04089; its code is the repository mlfoundations/task_vectors).

Each reader reads exactly the files its torchvision class reads, in the same way, and returns a
paper_split.PaperSplit of file paths (or ArrayRefs rows) and labels; registry.TASKS[name].layout and .provenance
document each layout and split. Class names are the ones task_vectors builds its zero-shot heads from.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Callable

import numpy as np

from dpmerge.data.paper_split import ArrayRefs, MissingDataError, PaperSplit, idx_array, require_paths

__all__ = ["READERS", "EUROSAT_NAMES"]


def _files(directory: Path, suffixes: tuple[str, ...]) -> list[str]:
    entries = os.scandir(directory)
    return sorted(entry.name for entry in entries if entry.is_file() and entry.name.lower().endswith(suffixes))


def _subdirs(directory: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


def _lines(path: Path) -> list[str]:
    with open(path) as handle:
        return [line.strip() for line in handle if line.strip()]


def _vision_split(class_names, train, test, name: str, data_dir: Path) -> PaperSplit:
    """Build a split from (path, label) lists, refusing overlap: a test image seen in training inflates accuracy."""
    train_paths = [str(p) for p, _ in train]
    test_paths = [str(p) for p, _ in test]
    shared = set(train_paths) & set(test_paths)
    if shared:
        raise ValueError(f"{name}: {len(shared)} image(s) in both train and test under {data_dir}, e.g. {min(shared)}")
    return PaperSplit(
        class_names=tuple(class_names),
        train_refs=np.array(train_paths, dtype=object),
        train_labels=np.array([label for _, label in train], dtype=np.int64),
        test_refs=np.array(test_paths, dtype=object),
        test_labels=np.array([label for _, label in test], dtype=np.int64),
        input_kind="image",
    )


def _listed(name: str, data_dir: Path, list_file: Path, paths) -> None:
    """Check that every image a split file names exists, listing each folder once (not one stat per image)."""
    seen: dict[Path, set[str]] = {}
    for path in paths:
        folder = path.parent
        if folder not in seen:
            seen[folder] = {entry.name for entry in os.scandir(folder)} if folder.is_dir() else set()
        if path.name not in seen[folder]:
            raise MissingDataError(name, path, data_dir, f"{list_file} names an image that is missing")


# Class names as task_vectors builds its zero-shot heads (CLIP's prompts.md wording for GTSRB and EuroSAT).
_DIGITS = tuple(str(d) for d in range(10))
_GTSRB_NAMES = (
    "red and white circle 20 kph speed limit",
    "red and white circle 30 kph speed limit",
    "red and white circle 50 kph speed limit",
    "red and white circle 60 kph speed limit",
    "red and white circle 70 kph speed limit",
    "red and white circle 80 kph speed limit",
    "end / de-restriction of 80 kph speed limit",
    "red and white circle 100 kph speed limit",
    "red and white circle 120 kph speed limit",
    "red and white circle red car and black car no passing",
    "red and white circle red truck and black car no passing",
    "red and white triangle road intersection warning",
    "white and yellow diamond priority road",
    "red and white upside down triangle yield right-of-way",
    "stop",
    "empty red and white circle",
    "red and white circle no truck entry",
    "red circle with white horizonal stripe no entry",
    "red and white triangle with exclamation mark warning",
    "red and white triangle with black left curve approaching warning",
    "red and white triangle with black right curve approaching warning",
    "red and white triangle with black double curve approaching warning",
    "red and white triangle rough / bumpy road warning",
    "red and white triangle car skidding / slipping warning",
    "red and white triangle with merging / narrow lanes warning",
    "red and white triangle with person digging / construction / road work warning",
    "red and white triangle with traffic light approaching warning",
    "red and white triangle with person walking warning",
    "red and white triangle with child and person walking warning",
    "red and white triangle with bicyle warning",
    "red and white triangle with snowflake / ice warning",
    "red and white triangle with deer warning",
    "white circle with gray strike bar no speed limit",
    "blue circle with white right turn arrow mandatory",
    "blue circle with white left turn arrow mandatory",
    "blue circle with white forward arrow mandatory",
    "blue circle with white forward or right turn arrow mandatory",
    "blue circle with white forward or left turn arrow mandatory",
    "blue circle with white keep right arrow mandatory",
    "blue circle with white keep left arrow mandatory",
    "blue circle with white arrows indicating a traffic circle",
    "white circle with gray strike bar indicating no passing for cars has ended",
    "white circle with gray strike bar indicating no passing for trucks has ended",
)
# EuroSAT folder -> task_vectors' name (its pretify_classname followed by its ours_to_open_ai table).
EUROSAT_NAMES = {
    "AnnualCrop": "annual crop land",
    "Forest": "forest",
    "HerbaceousVegetation": "brushland or shrubland",
    "Highway": "highway or road",
    "Industrial": "industrial buildings or commercial buildings",
    "Pasture": "pasture land",
    "PermanentCrop": "permanent crop land",
    "Residential": "residential buildings or homes or apartments",
    "River": "river",
    "SeaLake": "lake or sea",
}


def _read_sun397(data_dir: Path) -> PaperSplit:
    root = data_dir / "sun397"
    images = root / "SUN397"
    class_file = images / "ClassName.txt"
    partitions = [root / "Partitions" / "Training_01.txt", root / "Partitions" / "Testing_01.txt"]
    require_paths("sun397", data_dir, class_file, *partitions)
    # torchvision's class keys: "/a/apartment_building/outdoor" -> "apartment_building/outdoor"
    keys = [line[3:] for line in _lines(class_file)]
    index = {key: i for i, key in enumerate(keys)}
    splits = []
    for partition in partitions:
        entries = _lines(partition)
        paths = [images / entry.lstrip("/") for entry in entries]
        labels = []
        for entry, path in zip(entries, paths):
            key = "/".join(Path(entry.lstrip("/")).parts[1:-1])
            if key not in index:
                raise ValueError(f"{partition}: {entry!r} is in no class of {class_file}")
            labels.append(index[key])
        _listed("sun397", data_dir, partition, paths)
        splits.append(list(zip(paths, labels)))
    names = [key.replace("/", " ").replace("_", " ") for key in keys]
    return _vision_split(names, splits[0], splits[1], "sun397", data_dir)


def _read_cars(data_dir: Path) -> PaperSplit:
    import scipy.io

    root = data_dir / "stanford_cars"
    meta = root / "devkit" / "cars_meta.mat"
    sources = [
        (root / "devkit" / "cars_train_annos.mat", root / "cars_train"),
        (root / "cars_test_annos_withlabels.mat", root / "cars_test"),
    ]
    require_paths("cars", data_dir, meta, *(p for pair in sources for p in pair))
    unreadable = (ValueError, KeyError, TypeError, IndexError, NotImplementedError, scipy.io.matlab.MatReadError)
    try:
        names = np.atleast_1d(scipy.io.loadmat(meta, squeeze_me=True)["class_names"])
        names = [str(n).replace("_", " ") for n in names]  # as task_vectors names them
    except unreadable as error:
        raise ValueError(f"{meta}: no readable 'class_names' cell array ({error})") from error
    splits = []
    for annotation_file, folder in sources:
        try:
            records = np.atleast_1d(scipy.io.loadmat(annotation_file, squeeze_me=True)["annotations"])
            # devkit classes count from 1
            items = [(folder / str(r["fname"]), int(r["class"]) - 1) for r in records]
        except unreadable as error:
            problem = f"no readable 'annotations' struct with fname, class ({error})"
            raise ValueError(f"{annotation_file}: {problem}") from error
        bad = [label + 1 for _, label in items if not 0 <= label < len(names)]
        if bad:
            raise ValueError(f"{annotation_file}: class {bad[0]} outside 1..{len(names)} of {meta}")
        _listed("cars", data_dir, annotation_file, [p for p, _ in items])
        splits.append(items)
    return _vision_split(names, splits[0], splits[1], "cars", data_dir)


def _read_resisc45(data_dir: Path) -> PaperSplit:
    root = data_dir / "resisc45"
    images = root / "NWPU-RESISC45"
    lists = [root / "resisc45-train.txt", root / "resisc45-test.txt"]
    require_paths("resisc45", data_dir, images, *lists)
    # torchgeo's reader: an ImageFolder over every class folder, keeping files whose base name a split lists
    classes = _subdirs(images)
    where = {}
    for label, cls in enumerate(classes):
        for file in _files(images / cls, (".jpg",)):
            where[file] = (images / cls / file, label)
    splits = []
    for list_file in lists:
        wanted = _lines(list_file)
        missing = [file for file in wanted if file not in where]
        if missing:
            problem = f"{list_file} names an image that is missing"
            raise MissingDataError("resisc45", images / missing[0], data_dir, problem)
        wanted = set(wanted)
        splits.append([item for file, item in where.items() if file in wanted])
    names = [cls.replace("_", " ") for cls in classes]
    return _vision_split(names, splits[0], splits[1], "resisc45", data_dir)


# EuroSAT split (see registry.TASKS["eurosat"].provenance): train is the first 8/10, test the last 1/10 of each class.
_EUROSAT_SEED = 1350


def _eurosat_split(files: list[str]) -> tuple[list[str], list[str]]:
    order = np.array(sorted(files))
    np.random.RandomState(_EUROSAT_SEED).shuffle(order)
    n = len(order)
    return list(order[: n * 8 // 10]), list(order[n * 9 // 10 :])


def _read_eurosat(data_dir: Path) -> PaperSplit:
    images = data_dir / "eurosat" / "2750"
    require_paths("eurosat", data_dir, images)
    classes = _subdirs(images)
    unknown = [cls for cls in classes if cls not in EUROSAT_NAMES]
    if unknown:
        raise ValueError(f"{images / unknown[0]}: not a EuroSAT class folder (known: {', '.join(EUROSAT_NAMES)})")
    train, test = [], []
    for label, cls in enumerate(classes):
        cls_train, cls_test = _eurosat_split(_files(images / cls, (".jpg",)))
        train += [(images / cls / file, label) for file in cls_train]
        test += [(images / cls / file, label) for file in cls_test]
    return _vision_split([EUROSAT_NAMES[cls] for cls in classes], train, test, "eurosat", data_dir)


def _read_svhn(data_dir: Path) -> PaperSplit:
    import scipy.io

    root = data_dir / "svhn"
    refs, labels = [], []
    for split in ("train", "test"):
        path = root / f"{split}_32x32.mat"
        require_paths("svhn", data_dir, path)
        try:
            shapes = {var: shape for var, shape, _ in scipy.io.whosmat(path)}
            y = scipy.io.loadmat(path, variable_names=["y"])["y"]
        except (ValueError, KeyError, OSError, NotImplementedError, scipy.io.matlab.MatReadError) as error:
            raise ValueError(f"{path}: not a MATLAB 5 file with X and y ({error})") from error
        label = y.astype(np.int64).reshape(-1)
        label[label == 10] = 0  # as torchvision: SVHN stores digit 0 as 10
        shape = shapes.get("X", ())
        if tuple(shape) != (32, 32, 3, len(label)) or label.min(initial=0) < 0 or label.max(initial=0) > 9:
            raise ValueError(f"{path}: expected X of shape (32, 32, 3, n) and n labels in 1..10; "
                             f"found X {shape} and {len(label)} labels in {np.unique(y)[:12]}")
        refs.append(ArrayRefs(str(path), "svhn", np.arange(len(label))))
        labels.append(label)
    return _digit_split(refs, labels)


def _digit_split(refs, labels) -> PaperSplit:
    # Stand-ins may hold fewer than ten digits; real data always has all ten.
    present = max(int(label.max(initial=0)) for label in labels) + 1
    return PaperSplit(_DIGITS[:present], refs[0], labels[0], refs[1], labels[1], input_kind="image")


def _read_mnist(data_dir: Path) -> PaperSplit:
    raw = data_dir / "mnist" / "MNIST" / "raw"
    refs, labels = [], []
    for prefix in ("train", "t10k"):
        images, targets = raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"
        require_paths("mnist", data_dir, images, targets)
        n = idx_array(images, 3).shape[0]
        label = np.array(idx_array(targets, 1), dtype=np.int64)
        if len(label) != n or label.max(initial=0) > 9:
            raise ValueError(f"{targets}: {len(label)} labels (max {label.max(initial=0)}) for {n} images in {images}")
        refs.append(ArrayRefs(str(images), "idx", np.arange(n)))
        labels.append(label)
    return _digit_split(refs, labels)


def _read_gtsrb(data_dir: Path) -> PaperSplit:
    root = data_dir / "gtsrb"
    training, test_images = root / "GTSRB" / "Training", root / "GTSRB" / "Final_Test" / "Images"
    test_csv = root / "GT-final_test.csv"
    require_paths("gtsrb", data_dir, training, test_images, test_csv)
    # torchvision labels training folders by sorted position; that is the class id only if they are 00000.. in order
    classes = _subdirs(training)
    if not classes or classes != [f"{i:05d}" for i in range(len(classes))] or len(classes) > len(_GTSRB_NAMES):
        raise ValueError(f"{training}: class folders should be 00000 .. 00042, found {classes[:3]} ...")
    train = [(training / c / f, label) for label, c in enumerate(classes) for f in _files(training / c, (".ppm",))]
    with open(test_csv, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter=";", skipinitialspace=True))
    try:
        test = [(test_images / row["Filename"], int(row["ClassId"])) for row in rows]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{test_csv}: needs ';'-separated Filename and ClassId columns ({error})") from error
    bad = [label for _, label in test if not 0 <= label < len(classes)]
    if bad:
        raise ValueError(f"{test_csv}: ClassId {bad[0]} has no training folder in {training}")
    _listed("gtsrb", data_dir, test_csv, [p for p, _ in test])
    return _vision_split(_GTSRB_NAMES[: len(classes)], train, test, "gtsrb", data_dir)


def _read_dtd(data_dir: Path) -> PaperSplit:
    root = data_dir / "dtd" / "dtd"
    lists = [root / "labels" / f"{split}1.txt" for split in ("train", "val", "test")]
    require_paths("dtd", data_dir, root / "images", *lists)
    entries = []
    for list_file in lists:
        lines = _lines(list_file)
        if any(line.count("/") != 1 for line in lines):
            raise ValueError(f"{list_file}: lines should read <class>/<file>.jpg")
        _listed("dtd", data_dir, list_file, [root / "images" / line for line in lines])
        entries.append(lines)
    # torchvision: classes are the sorted class names the split file mentions (all 47 in every real split)
    classes = sorted({line.split("/")[0] for lines in entries for line in lines})
    index = {cls: i for i, cls in enumerate(classes)}

    def items(lines):
        return [(root / "images" / line, index[line.split("/")[0]]) for line in lines]

    names = [c.replace("_", " ") for c in classes]  # as task_vectors names them (no real DTD class has one)
    return _vision_split(names, items(entries[0] + entries[1]), items(entries[2]), "dtd", data_dir)


READERS: dict[str, Callable[[Path], PaperSplit]] = {
    "sun397": _read_sun397,
    "cars": _read_cars,
    "resisc45": _read_resisc45,
    "eurosat": _read_eurosat,
    "svhn": _read_svhn,
    "gtsrb": _read_gtsrb,
    "mnist": _read_mnist,
    "dtd": _read_dtd,
}
