"""The paper's sixteen datasets, read from a data directory in the layouts torchvision and Hugging Face
`datasets` write: :func:`read_split` reads one, :func:`download` fetches one.

The paper evaluates on the eight vision tasks of the task-vector literature (Ilharco et al., "Editing Models with
Task Arithmetic", arXiv:2212.04089, repository mlfoundations/task_vectors) and on eight GLUE tasks (Wang et al.,
"GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding", arXiv:1804.07461). None
of that data ships with Python packages, so it lives in a configurable data directory, prepared once with
:func:`download` (the `dpmerge prepare-data` command) or by hand; registry.TASKS documents each layout and split.
The readers are in paper_vision.py and paper_glue.py, what they return (and MissingDataError) in paper_split.py.

standins.write_standin writes a tiny random dataset in the same on-disk format, so tests (and the CPU default
pipeline) exercise these readers end to end without the real data.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from dpmerge.data.paper_glue import read_glue
from dpmerge.data.paper_split import PaperSplit
from dpmerge.data.paper_vision import READERS
from dpmerge.data.registry import GLUE_TASKS, PAPER_TASKS, TASKS
from dpmerge.runtime import make_torchvision_importable

__all__ = ["read_split", "download", "dataset_dir"]


def read_split(name: str, data_dir: str | Path) -> PaperSplit:
    """The train and test split of paper task `name` from `data_dir` (layouts and splits: registry.TASKS[name])."""
    if name not in PAPER_TASKS:
        raise ValueError(f"unknown paper task {name!r}; known: {', '.join(PAPER_TASKS)}")
    data_dir = Path(data_dir)
    if name in GLUE_TASKS:
        return read_glue(name, data_dir)
    return READERS[name](data_dir)


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
            f"and arrange it under {data_dir} as: {TASKS['cars'].layout}"
        )
    try:
        _fetch(name, data_dir)
    except Exception as error:  # network and archive failures come in many types; all need the same advice
        raise RuntimeError(
            f"{name}: download into {data_dir} failed ({type(error).__name__}: {error}). This needs network "
            f"access; alternatively put the files there as: {TASKS[name].layout}"
        ) from error
    read_split(name, data_dir)  # fail now, not in a training job, if the download is not what the reader expects
    return dataset_dir(name, data_dir)


def dataset_dir(name: str, data_dir: Path) -> Path:
    """The folder task `name` has under `data_dir` (what download and standins.write_standin return)."""
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
    make_torchvision_importable()
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
