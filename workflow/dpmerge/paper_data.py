"""The paper's sixteen datasets, read from disk in the layouts torchvision and Hugging Face `datasets` write.

The paper evaluates on the eight vision tasks of the task-vector literature (Ilharco et al., "Editing models with
task arithmetic", repository mlfoundations/task_vectors) and on eight GLUE tasks. None of that data ships with
Python packages, so it lives in a configurable data directory, prepared once with :func:`download` (the
`dpmerge prepare-data` command) or by hand. :func:`read_split` reads exactly the files torchvision's dataset
classes read (or, for RESISC45, torchgeo's), in the same way, with the train/test split the literature uses;
:data:`PAPER_TASKS` documents each layout and split.

Nothing here decodes an image until asked: :func:`read_split` returns cheap per-example references (file paths,
or row numbers into MNIST's idx and SVHN's .mat arrays) and :meth:`PaperSplit.render` turns a chunk of them into
pixels with CLIP's evaluation crop, so a 100k-image training set never sits in memory at once.

:func:`write_standin` writes a tiny random dataset in the same on-disk format, so tests (and the CPU default
pipeline) exercise the real readers end to end without the real data. Stand-in images and sentences carry a
learnable class cue (a class colour and stripe pattern; a class word), so a model trained on them must improve.
"""

from __future__ import annotations

import colorsys
import csv
import functools
import os
import shutil
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from PIL import Image

from dpmerge.metrics import METRICS

__all__ = [
    "VISION_TASKS",
    "GLUE_TASKS",
    "PaperTaskInfo",
    "PAPER_TASKS",
    "MissingDataError",
    "ArrayRefs",
    "PaperSplit",
    "read_split",
    "download",
    "write_standin",
]

VISION_TASKS: tuple[str, ...] = ("sun397", "cars", "resisc45", "eurosat", "svhn", "gtsrb", "mnist", "dtd")
GLUE_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")

@dataclass(frozen=True)
class PaperTaskInfo:
    name: str
    modality: str  # "vision" | "text"
    input_kind: str  # "image" | "single" | "pair"
    num_classes: int  # of the real dataset; 1 for stsb, a regression
    metric: str
    description: str
    provenance: str  # source, and which files or split are train and which are test
    licence: str
    layout: str  # the paths under the data directory that read_split looks at

    def __post_init__(self) -> None:
        # A typo in the registry would otherwise surface deep inside a training or evaluation rule.
        if (self.modality, self.input_kind) not in {("vision", "image"), ("text", "single"), ("text", "pair")}:
            raise ValueError(f"task {self.name!r}: modality {self.modality!r} / input_kind {self.input_kind!r}")
        if self.metric not in METRICS:
            raise ValueError(f"task {self.name!r}: metric {self.metric!r} not in {METRICS}")


_GLUE_LAYOUT = "glue/{}/ as written by datasets.DatasetDict.save_to_disk (dataset_dict.json, {}/, {}/)"
_GLUE_PROVENANCE = (
    "GLUE (Wang et al. 2019) via the Hugging Face dataset nyu-mll/glue, config {0!r}; train = 'train', "
    "test = '{1}' (GLUE's test labels are hidden, so the literature reports the validation split)."
)


def _glue(name, input_kind, num_classes, metric, description, licence, test_split="validation") -> PaperTaskInfo:
    return PaperTaskInfo(
        name=name,
        modality="text",
        input_kind=input_kind,
        num_classes=num_classes,
        metric=metric,
        description=description,
        provenance=_GLUE_PROVENANCE.format(name, test_split),
        licence=licence,
        layout=_GLUE_LAYOUT.format(name, "train", test_split),
    )


PAPER_TASKS: dict[str, PaperTaskInfo] = {
    "sun397": PaperTaskInfo(
        name="sun397",
        modality="vision",
        input_kind="image",
        num_classes=397,
        metric="accuracy",
        description="Scene categories (abbey, airport terminal, ...) of web photographs.",
        provenance=(
            "SUN397 (Xiao et al. 2010, vision.princeton.edu/projects/2010/SUN) as torchvision.datasets.SUN397 "
            "unpacks it, with the official partition 01 (Partitions.zip): train = Training_01.txt, test = "
            "Testing_01.txt, 50 + 50 images per class (19,850 each), the split task_vectors' train/ and val/ "
            "folders hold. Class names: ClassName.txt entries with '/' and '_' read as spaces."
        ),
        licence="Web images, copyright with their owners; released for research, no explicit licence.",
        layout=(
            "sun397/SUN397/ClassName.txt, sun397/SUN397/<letter>/<class>[/<subclass>]/sun_*.jpg, "
            "sun397/Partitions/Training_01.txt, sun397/Partitions/Testing_01.txt"
        ),
    ),
    "cars": PaperTaskInfo(
        name="cars",
        modality="vision",
        input_kind="image",
        num_classes=196,
        metric="accuracy",
        description="Make, model and year of cars (Stanford Cars).",
        provenance=(
            "Stanford Cars (Krause et al. 2013) in the devkit layout torchvision.datasets.StanfordCars reads (as "
            "task_vectors' copy of it does): train = devkit/cars_train_annos.mat (8,144 images), test = "
            "cars_test_annos_withlabels.mat (8,041). The original URL is gone; copies circulate (e.g. Kaggle)."
        ),
        licence="Non-commercial research and educational use (terms of the original release).",
        layout=(
            "stanford_cars/devkit/cars_meta.mat, stanford_cars/devkit/cars_train_annos.mat, stanford_cars/cars_train/, "
            "stanford_cars/cars_test_annos_withlabels.mat, stanford_cars/cars_test/"
        ),
    ),
    "resisc45": PaperTaskInfo(
        name="resisc45",
        modality="vision",
        input_kind="image",
        num_classes=45,
        metric="accuracy",
        description="Remote-sensing scene classes (NWPU-RESISC45), 256x256 aerial images.",
        provenance=(
            "NWPU-RESISC45 (Cheng et al. 2017) in torchgeo's layout, which task_vectors copies: train = "
            "resisc45-train.txt (18,900 images), test = resisc45-test.txt (6,300), the splits of Neumann et al. "
            "2019 (arXiv:1911.06721), mirrored at hf.co/datasets/torchgeo/resisc45."
        ),
        licence="Released by NWPU for research; no explicit licence.",
        layout="resisc45/NWPU-RESISC45/<class>/*.jpg, resisc45/resisc45-train.txt, resisc45/resisc45-test.txt",
    ),
    "eurosat": PaperTaskInfo(
        name="eurosat",
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Land-use classes of 64x64 Sentinel-2 RGB tiles (EuroSAT).",
        provenance=(
            "EuroSAT RGB (Helber et al. 2019) as torchvision.datasets.EuroSAT unpacks it. Ilharco et al. split the "
            "27,000 images at random into 21,600 / 2,700 / 2,700 train / val / test (task_vectors issue #1) and "
            "published neither seed nor file lists; here each class folder's files, sorted by name, are shuffled "
            "with numpy.random.RandomState(1350) (the seed of a public re-implementation of that split) and cut "
            "80% / 10% / 10%; train = the first 80%, test = the last 10%, the middle 10% (val) is unused."
        ),
        licence="MIT (github.com/phelber/EuroSAT); Copernicus Sentinel-2 data.",
        layout="eurosat/2750/<ClassName>/*.jpg",
    ),
    "svhn": PaperTaskInfo(
        name="svhn",
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Street View House Numbers: the digit centred in a 32x32 crop.",
        provenance=(
            "SVHN cropped digits (Netzer et al. 2011) as torchvision.datasets.SVHN downloads them: train = "
            "train_32x32.mat (73,257), test = test_32x32.mat (26,032); label 10 means digit 0. 'extra' is unused."
        ),
        licence="Non-commercial use only (ufldl.stanford.edu/housenumbers).",
        layout="svhn/train_32x32.mat, svhn/test_32x32.mat",
    ),
    "gtsrb": PaperTaskInfo(
        name="gtsrb",
        modality="vision",
        input_kind="image",
        num_classes=43,
        metric="accuracy",
        description="German traffic-sign classes.",
        provenance=(
            "GTSRB (Stallkamp et al. 2012) as torchvision.datasets.GTSRB downloads it: train = "
            "GTSRB/Training/<class>/*.ppm (26,640), test = Final_Test/Images with labels from GT-final_test.csv "
            "(12,630). Class names: task_vectors' descriptions from OpenAI CLIP's prompts.md."
        ),
        licence="Released for research on benchmark.ini.rub.de; no explicit licence.",
        layout=(
            "gtsrb/GTSRB/Training/<00000..00042>/*.ppm, gtsrb/GTSRB/Final_Test/Images/*.ppm, gtsrb/GT-final_test.csv"
        ),
    ),
    "mnist": PaperTaskInfo(
        name="mnist",
        modality="vision",
        input_kind="image",
        num_classes=10,
        metric="accuracy",
        description="Handwritten digits, 28x28 grayscale.",
        provenance=(
            "MNIST (LeCun et al. 1998) as torchvision.datasets.MNIST stores it: train = train-*-ubyte (60,000), "
            "test = t10k-*-ubyte (10,000)."
        ),
        licence="CC BY-SA 3.0 (as commonly redistributed).",
        layout="mnist/MNIST/raw/{train,t10k}-images-idx3-ubyte, mnist/MNIST/raw/{train,t10k}-labels-idx1-ubyte",
    ),
    "dtd": PaperTaskInfo(
        name="dtd",
        modality="vision",
        input_kind="image",
        num_classes=47,
        metric="accuracy",
        description="Describable textures (banded, blotchy, ...).",
        provenance=(
            "DTD (Cimpoi et al. 2014) as torchvision.datasets.DTD unpacks it, partition 1: train = train1.txt + "
            "val1.txt (3,760), test = test1.txt (1,880), as task_vectors does (following PAINT; issue #1)."
        ),
        licence="Research use (robots.ox.ac.uk/~vgg/data/dtd).",
        layout="dtd/dtd/images/<class>/*.jpg, dtd/dtd/labels/train1.txt, val1.txt, test1.txt",
    ),
    "cola": _glue(
        "cola", "single", 2, "mcc", "Is the sentence grammatically acceptable? (CoLA)",
        "Distributed by the CoLA authors for research (nyu-mll.github.io/CoLA).",
    ),
    "sst2": _glue(
        "sst2", "single", 2, "accuracy", "Sentiment of a movie-review sentence (SST-2).",
        "Stanford Sentiment Treebank terms, research use (nlp.stanford.edu/sentiment).",
    ),
    "mrpc": _glue(
        "mrpc", "pair", 2, "f1_accuracy", "Are the two news sentences paraphrases? (MRPC)",
        "Microsoft Research Paraphrase Corpus licence (research use).",
    ),
    "qqp": _glue(
        "qqp", "pair", 2, "f1_accuracy", "Are the two Quora questions duplicates? (QQP)",
        "Quora's terms for the Question Pairs release (non-commercial research).",
    ),
    "stsb": _glue(
        "stsb", "pair", 1, "spearman", "Semantic similarity of two sentences on a 0-5 scale (STS-B).",
        "Compiled from SemEval STS tasks; each source keeps its terms.",
    ),
    "mnli": _glue(
        "mnli", "pair", 3, "accuracy", "Entailment / neutral / contradiction of premise and hypothesis (MNLI).",
        "MultiNLI: mostly OANC text (free use), fiction parts CC BY-SA 3.0.",
        test_split="validation_matched",
    ),
    "qnli": _glue(
        "qnli", "pair", 2, "accuracy", "Does the sentence answer the question? (QNLI, from SQuAD)",
        "Derived from SQuAD (CC BY-SA 4.0).",
    ),
    "rte": _glue(
        "rte", "pair", 2, "accuracy", "Does the first sentence entail the second? (RTE)",
        "PASCAL / TAC RTE challenge data, research use.",
    ),
}


class MissingDataError(FileNotFoundError):
    """A dataset's files are not where :func:`read_split` looks; the message says where and how to get them."""

    def __init__(self, name: str, path: Path, data_dir: Path, problem: str = "not found"):
        super().__init__(
            f"{name}: {problem}: {path}\n"
            f"  expected under {data_dir}: {PAPER_TASKS[name].layout}\n"
            f"  prepare it with `dpmerge prepare-data --task {name} --data-dir {data_dir}` (needs network), "
            f"or put the files there in that layout."
        )


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


# ---------------------------------------------------------------------------------------------- reading


def read_split(name: str, data_dir: str | Path) -> PaperSplit:
    """The train and test split of paper task `name` from `data_dir` (layouts and splits: :data:`PAPER_TASKS`)."""
    if name not in PAPER_TASKS:
        raise ValueError(f"unknown paper task {name!r}; known: {', '.join(PAPER_TASKS)}")
    data_dir = Path(data_dir)
    if name in GLUE_TASKS:
        return _read_glue(name, data_dir)
    return _READERS[name](data_dir)


def _need(name: str, data_dir: Path, *paths: Path) -> None:
    for path in paths:
        if not path.exists():
            raise MissingDataError(name, path, data_dir)


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
_EUROSAT_NAMES = {
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
    _need("sun397", data_dir, class_file, *partitions)
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
    _need("cars", data_dir, meta, *(p for pair in sources for p in pair))
    unreadable = (ValueError, KeyError, TypeError, IndexError, NotImplementedError, scipy.io.matlab.MatReadError)
    try:
        names = np.atleast_1d(scipy.io.loadmat(meta, squeeze_me=True)["class_names"])
        names = [str(n).replace("_", " ") for n in names]  # as task_vectors names them
    except unreadable as error:
        raise ValueError(f"{meta}: no readable 'class_names' cell array ({error})") from error
    splits = []
    for annotations, folder in sources:
        try:
            records = np.atleast_1d(scipy.io.loadmat(annotations, squeeze_me=True)["annotations"])
            # devkit classes count from 1
            items = [(folder / str(r["fname"]), int(r["class"]) - 1) for r in records]
        except unreadable as error:
            raise ValueError(f"{annotations}: no readable 'annotations' struct with fname, class ({error})") from error
        bad = [label + 1 for _, label in items if not 0 <= label < len(names)]
        if bad:
            raise ValueError(f"{annotations}: class {bad[0]} outside 1..{len(names)} of {meta}")
        _listed("cars", data_dir, annotations, [p for p, _ in items])
        splits.append(items)
    return _vision_split(names, splits[0], splits[1], "cars", data_dir)


def _read_resisc45(data_dir: Path) -> PaperSplit:
    root = data_dir / "resisc45"
    images = root / "NWPU-RESISC45"
    lists = [root / "resisc45-train.txt", root / "resisc45-test.txt"]
    _need("resisc45", data_dir, images, *lists)
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


# EuroSAT split (see PAPER_TASKS["eurosat"].provenance): train is the first 8/10, test the last 1/10 of each class.
_EUROSAT_SEED = 1350


def _eurosat_split(files: list[str]) -> tuple[list[str], list[str]]:
    order = np.array(sorted(files))
    np.random.RandomState(_EUROSAT_SEED).shuffle(order)
    n = len(order)
    return list(order[: n * 8 // 10]), list(order[n * 9 // 10 :])


def _read_eurosat(data_dir: Path) -> PaperSplit:
    images = data_dir / "eurosat" / "2750"
    _need("eurosat", data_dir, images)
    classes = _subdirs(images)
    unknown = [cls for cls in classes if cls not in _EUROSAT_NAMES]
    if unknown:
        raise ValueError(f"{images / unknown[0]}: not a EuroSAT class folder (known: {', '.join(_EUROSAT_NAMES)})")
    train, test = [], []
    for label, cls in enumerate(classes):
        cls_train, cls_test = _eurosat_split(_files(images / cls, (".jpg",)))
        train += [(images / cls / file, label) for file in cls_train]
        test += [(images / cls / file, label) for file in cls_test]
    return _vision_split([_EUROSAT_NAMES[cls] for cls in classes], train, test, "eurosat", data_dir)


@functools.lru_cache(maxsize=2)
def _svhn_pixels(path: str, stamp: tuple) -> np.ndarray:
    # One decoded .mat per split (train: 225 MB) is kept so that rendering chunk after chunk reads it once.
    import scipy.io

    return scipy.io.loadmat(path, variable_names=["X"])["X"].transpose(3, 0, 1, 2)


def _read_svhn(data_dir: Path) -> PaperSplit:
    import scipy.io

    root = data_dir / "svhn"
    refs, labels = [], []
    for split in ("train", "test"):
        path = root / f"{split}_32x32.mat"
        _need("svhn", data_dir, path)
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


def _idx_array(path: Path, ndim: int) -> np.ndarray:
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
    return _idx_array(Path(path), 3)


def _read_mnist(data_dir: Path) -> PaperSplit:
    raw = data_dir / "mnist" / "MNIST" / "raw"
    refs, labels = [], []
    for prefix in ("train", "t10k"):
        images, targets = raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"
        _need("mnist", data_dir, images, targets)
        n = _idx_array(images, 3).shape[0]
        label = np.array(_idx_array(targets, 1), dtype=np.int64)
        if len(label) != n or label.max(initial=0) > 9:
            raise ValueError(f"{targets}: {len(label)} labels (max {label.max(initial=0)}) for {n} images in {images}")
        refs.append(ArrayRefs(str(images), "idx", np.arange(n)))
        labels.append(label)
    return _digit_split(refs, labels)


def _read_gtsrb(data_dir: Path) -> PaperSplit:
    root = data_dir / "gtsrb"
    training, test_images = root / "GTSRB" / "Training", root / "GTSRB" / "Final_Test" / "Images"
    test_csv = root / "GT-final_test.csv"
    _need("gtsrb", data_dir, training, test_images, test_csv)
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
    _need("dtd", data_dir, root / "images", *lists)
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


_READERS: dict[str, Callable[[Path], PaperSplit]] = {
    "sun397": _read_sun397,
    "cars": _read_cars,
    "resisc45": _read_resisc45,
    "eurosat": _read_eurosat,
    "svhn": _read_svhn,
    "gtsrb": _read_gtsrb,
    "mnist": _read_mnist,
    "dtd": _read_dtd,
}

# GLUE columns (nyu-mll/glue) and label names; stsb's label is a float score.
_GLUE_COLUMNS = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
}
_GLUE_LABELS = {
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
}
_STSB_NAMES = ("similarity",)


def _glue_splits(name: str) -> tuple[str, str]:
    return "train", "validation_matched" if name == "mnli" else "validation"


def _read_glue(name: str, data_dir: Path) -> PaperSplit:
    path = data_dir / "glue" / name
    _need(name, data_dir, path / "dataset_dict.json")
    import datasets

    try:
        splits = datasets.load_from_disk(str(path))
    except Exception as error:  # datasets raises many types for a damaged directory; all mean the same here
        raise ValueError(f"{path}: not readable by datasets.load_from_disk ({error})") from error
    if not isinstance(splits, datasets.DatasetDict):
        raise ValueError(f"{path}: holds a {type(splits).__name__}, not a DatasetDict of GLUE splits")
    columns = _GLUE_COLUMNS[name]
    refs, labels, class_names = [], [], _STSB_NAMES
    for split in _glue_splits(name):
        if split not in splits:
            raise ValueError(f"{path}: no {split!r} split (has {list(splits)})")
        table = splits[split].with_format("arrow")
        missing = [c for c in (*columns, "label") if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}/{split}: missing column(s) {missing} (has {table.column_names})")
        label = table["label"].to_numpy()
        if name == "stsb":
            label = label.astype(np.float32)
        else:
            feature = splits[split].features["label"]
            if not isinstance(feature, datasets.ClassLabel):
                raise ValueError(f"{path}/{split}: 'label' should be a ClassLabel, is {feature}")
            class_names = tuple(feature.names)
            label = label.astype(np.int64)
            if label.min(initial=0) < 0 or label.max(initial=0) >= len(class_names):
                raise ValueError(f"{path}/{split}: labels outside 0..{len(class_names) - 1} (unlabelled test data?)")
        texts = np.empty((len(label), len(columns)), dtype=object)
        for j, column in enumerate(columns):
            texts[:, j] = table[column].to_numpy(zero_copy_only=False)
        refs.append(texts[:, 0] if len(columns) == 1 else texts)
        labels.append(label)
    kind = PAPER_TASKS[name].input_kind
    return PaperSplit(class_names, refs[0], labels[0], refs[1], labels[1], input_kind=kind)


# ---------------------------------------------------------------------------------------------- download


def download(name: str, data_dir: str | Path) -> Path:
    """Fetch task `name` into `data_dir` in the layout :func:`read_split` reads (needs network); returns its folder.

    Vision data comes through torchvision's own downloaders (torchgeo's mirror for RESISC45, plus SUN397's
    official Partitions.zip); GLUE through `datasets.load_dataset("nyu-mll/glue", name).save_to_disk`. Stanford
    Cars can no longer be downloaded from its source and raises with what to do instead.
    """
    if name not in PAPER_TASKS:
        raise ValueError(f"unknown paper task {name!r}; known: {', '.join(PAPER_TASKS)}")
    data_dir = Path(data_dir)
    if name == "cars":
        raise RuntimeError(
            "cars: Stanford Cars' original URL is gone, so it cannot be downloaded automatically. Get a copy "
            "(e.g. Kaggle 'jessicali9530/stanford-cars-dataset' plus the devkit with cars_test_annos_withlabels.mat) "
            f"and arrange it under {data_dir} as: {PAPER_TASKS['cars'].layout}"
        )
    try:
        _fetch(name, data_dir)
    except Exception as error:  # network and archive failures come in many types; all need the same advice
        raise RuntimeError(
            f"{name}: download into {data_dir} failed ({type(error).__name__}: {error}). This needs network "
            f"access; alternatively put the files there as: {PAPER_TASKS[name].layout}"
        ) from error
    read_split(name, data_dir)  # fail now, not in a training job, if the download is not what the reader expects
    return _dataset_dir(name, data_dir)


def _dataset_dir(name: str, data_dir: Path) -> Path:
    if name in GLUE_TASKS:
        return data_dir / "glue" / name
    return data_dir / {"cars": "stanford_cars"}.get(name, name)


_RESISC45_MIRROR = "https://hf.co/datasets/torchgeo/resisc45/resolve/a826b44d938a883185f11ebe3d512d38b464312f/"
_RESISC45_MD5 = {
    "NWPU-RESISC45.zip": "75206b2e16446591afa88e2628744886",
    "resisc45-train.txt": "b5a4c05a37de15e4ca886696a85c403e",
    "resisc45-val.txt": "a0770cee4c5ca20b8c32bbd61e114805",
    "resisc45-test.txt": "3dda9e4988b47eb1de9f07993653eb08",
}
_SUN397_PARTITIONS = "https://vision.princeton.edu/projects/2010/SUN/download/Partitions.zip"


def _fetch(name: str, data_dir: Path) -> None:
    if name in GLUE_TASKS:
        import datasets

        datasets.load_dataset("nyu-mll/glue", name).save_to_disk(str(data_dir / "glue" / name))
        return
    from torchvision import datasets as tv
    from torchvision.datasets.utils import download_and_extract_archive, download_url, extract_archive

    if name == "mnist":
        for train in (True, False):
            tv.MNIST(data_dir / "mnist", train=train, download=True)
    elif name == "svhn":
        for split in ("train", "test"):
            tv.SVHN(data_dir / "svhn", split=split, download=True)
    elif name == "gtsrb":
        for split in ("train", "test"):
            tv.GTSRB(data_dir, split=split, download=True)
    elif name == "dtd":
        tv.DTD(data_dir, download=True)
    elif name == "eurosat":
        tv.EuroSAT(data_dir, download=True)
    elif name == "sun397":
        tv.SUN397(data_dir / "sun397", download=True)
        target = data_dir / "sun397" / "Partitions"
        target.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(dir=data_dir / "sun397") as scratch:
            download_and_extract_archive(_SUN397_PARTITIONS, download_root=scratch)
            for file in ("Training_01.txt", "Testing_01.txt"):
                shutil.copy(next(Path(scratch).rglob(file)), target / file)
    elif name == "resisc45":
        root = data_dir / "resisc45"
        for file, md5 in _RESISC45_MD5.items():
            download_url(_RESISC45_MIRROR + file, str(root), filename=file, md5=md5)
        extract_archive(str(root / "NWPU-RESISC45.zip"), str(root))


# ---------------------------------------------------------------------------------------------- stand-ins


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

    :func:`read_split` then reads it through the same code path as real data. Each class gets `train_per_class`
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
    info = PAPER_TASKS[name]
    data_dir = Path(data_dir)
    target = _dataset_dir(name, data_dir)
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
    for label, cls in enumerate(sorted(_EUROSAT_NAMES)[: pixels.num_classes]):
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

    columns = _GLUE_COLUMNS[name]
    if name == "stsb":
        label_feature, num_labels = datasets.Value("float32"), 6
    else:
        label_feature, num_labels = datasets.ClassLabel(names=list(_GLUE_LABELS[name])), len(_GLUE_LABELS[name])
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

    train, test = _glue_splits(name)
    # GLUE's unlabelled test splits (label -1) are written too, as load_dataset does, and must stay unread.
    unlabelled = ["test_matched", "test_mismatched"] if name == "mnli" else ["test"]
    parts = {train: split(n_train), test: split(n_test)}
    if name == "mnli":
        parts["validation_mismatched"] = split(1)
    parts.update({part: split(1, labelled=False) for part in unlabelled})
    datasets.DatasetDict(parts).save_to_disk(str(target))
