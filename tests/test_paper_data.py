"""Tests for the paper's datasets (dpmerge.data.paper, its readers, and standins.py): every reader on a stand-in in
the real on-disk layout, cross-checked against torchvision's own dataset classes, plus error messages and CLIP's
evaluation crop."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from dpmerge.data import paper, paper_split, paper_vision, standins
from dpmerge.data.paper import read_split
from dpmerge.data.paper_split import ArrayRefs, MissingDataError
from dpmerge.data.registry import GLUE_TASKS, PAPER_TASKS, TASKS, VISION_TASKS
from dpmerge.data.standins import write_standin
from dpmerge.models import zeroshot_prompts as Z

K = 3  # classes in vision stand-ins
TRAIN, TEST = 4, 2  # write_standin's defaults, per class
# EuroSAT's split is a fixed 80/10/10 cut of each class folder; 11 files per class is the fewest giving >= 4 / >= 2.
EUROSAT_TRAIN, EUROSAT_TEST = 8, 2

EXPECTED_NAMES = {
    "sun397": ("scene 000", "scene 001 outdoor", "scene 002"),
    "cars": tuple(f"Standin Make Model{i:03d} Sedan 2012" for i in range(K)),
    "resisc45": ("airplane", "airport", "baseball diamond"),
    "eurosat": ("annual crop land", "forest", "brushland or shrubland"),
    "svhn": ("0", "1", "2"),
    "gtsrb": (
        "red and white circle 20 kph speed limit",
        "red and white circle 30 kph speed limit",
        "red and white circle 50 kph speed limit",
    ),
    "mnist": ("0", "1", "2"),
    "dtd": ("banded", "blotchy", "braided"),
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "stsb": ("similarity",),
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
}


def standin(name, data_dir, **kwargs):
    kwargs.setdefault("num_classes", K if name in VISION_TASKS else None)
    write_standin(name, data_dir, **kwargs)
    return read_split(name, data_dir)


def refs_list(refs):
    if isinstance(refs, ArrayRefs):
        return [(refs.path, int(row)) for row in refs.rows]
    return [tuple(r) if isinstance(r, np.ndarray) else r for r in refs]


# ---------------------------------------------------------------- registry


def test_registry():
    assert VISION_TASKS == ("sun397", "cars", "resisc45", "eurosat", "svhn", "gtsrb", "mnist", "dtd")
    assert GLUE_TASKS == ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte")
    assert list(PAPER_TASKS) == [*VISION_TASKS, *GLUE_TASKS]
    metrics = {name: TASKS[name].metric for name in PAPER_TASKS}
    assert metrics == {**{n: "accuracy" for n in PAPER_TASKS}, "cola": "mcc", "mrpc": "f1_accuracy",
                       "qqp": "f1_accuracy", "stsb": "spearman"}
    counts = {n: TASKS[n].num_classes for n in PAPER_TASKS}
    assert counts == {"sun397": 397, "cars": 196, "resisc45": 45, "eurosat": 10, "svhn": 10, "gtsrb": 43, "mnist": 10,
                      "dtd": 47, "cola": 2, "sst2": 2, "mrpc": 2, "qqp": 2, "stsb": 1, "mnli": 3, "qnli": 2, "rte": 2}
    for name in PAPER_TASKS:
        info = TASKS[name]
        assert info.name == name
        assert info.input_kind == ("image" if name in VISION_TASKS
                                   else "single" if name in ("cola", "sst2") else "pair")
        assert info.description and info.provenance and info.licence and info.layout


def test_real_name_lists_match_the_literature():
    # the lists stand-ins draw from are the real ones: all 43 GTSRB, 45 RESISC45, 47 DTD, 10 EuroSAT classes
    assert len(paper_vision._GTSRB_NAMES) == 43 and len(set(paper_vision._GTSRB_NAMES)) == 43
    assert len(standins._RESISC45_CLASSES) == 45 and standins._RESISC45_CLASSES == sorted(standins._RESISC45_CLASSES)
    assert len(standins._DTD_CLASSES) == 47 and standins._DTD_CLASSES == sorted(standins._DTD_CLASSES)
    assert len(paper_vision.EUROSAT_NAMES) == 10


# ---------------------------------------------------------------- every task through its reader


@pytest.mark.parametrize("name", list(PAPER_TASKS))
def test_standin_round_trip(name, tmp_path):
    split = standin(name, tmp_path)
    info = TASKS[name]
    assert split.class_names == EXPECTED_NAMES[name]
    k = 6 if name == "stsb" else len(split.class_names)  # stsb stand-in: one group per whole score 0..5
    n_train, n_test = (EUROSAT_TRAIN, EUROSAT_TEST) if name == "eurosat" else (TRAIN, TEST)
    assert len(split.train_refs) == len(split.train_labels) == k * n_train
    assert len(split.test_refs) == len(split.test_labels) == k * n_test
    if name == "stsb":
        assert split.train_labels.dtype == np.float32
        assert 0.0 <= split.train_labels.min() and split.train_labels.max() <= 5.0
    else:
        assert split.train_labels.dtype == split.test_labels.dtype == np.int64
        for labels, per_class in ((split.train_labels, n_train), (split.test_labels, n_test)):
            assert np.bincount(labels, minlength=k).tolist() == [per_class] * k
    train, test = refs_list(split.train_refs), refs_list(split.test_refs)
    assert len(set(train)) == len(train) and not set(train) & set(test)

    chunk = split.render(split.train_refs[:5], image_size=16)
    if info.modality == "vision":
        assert chunk.shape == (5, 3, 16, 16) and chunk.dtype == np.uint8
        assert_learnable_images(split)
    else:
        expected_type = str if info.input_kind == "single" else tuple
        assert len(chunk) == 5 and all(isinstance(x, expected_type) for x in chunk)
        assert_learnable_text(split, info.input_kind)


def assert_learnable_images(split):
    """Nearest class mean on 16x16 renders classifies every test image: the stand-in carries its class."""
    train = split.render(split.train_refs, 16).reshape(len(split.train_labels), -1).astype(float)
    test = split.render(split.test_refs, 16).reshape(len(split.test_labels), -1).astype(float)
    means = np.stack([train[split.train_labels == c].mean(0) for c in range(len(split.class_names))])
    predicted = ((test[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predicted == split.test_labels).all()


def assert_learnable_text(split, kind):
    texts = split.render(split.train_refs, 0) + split.render(split.test_refs, 0)
    labels = np.concatenate([split.train_labels, split.test_labels]).astype(int)  # stsb: the whole score
    last = [t if kind == "single" else t[1] for t in texts]
    for cue, label in zip(standins._CUES, range(labels.max() + 1)):
        assert [cue in t.split() for t in last] == list(labels == label)


def test_num_classes_none_gives_the_real_count(tmp_path):
    split = standin("gtsrb", tmp_path, num_classes=None, train_per_class=1, test_per_class=1, image_size=8)
    assert split.class_names == paper_vision._GTSRB_NAMES
    assert sorted(set(split.test_labels)) == list(range(43))
    assert standin("mnist", tmp_path, num_classes=None).class_names == tuple("0123456789")


def test_standin_arguments_are_checked(tmp_path):
    write_standin("dtd", tmp_path, num_classes=2)
    with pytest.raises(FileExistsError, match="not empty"):
        write_standin("dtd", tmp_path, num_classes=2)  # never over real data
    with pytest.raises(ValueError, match="num_classes"):
        write_standin("mnist", tmp_path, num_classes=11)
    with pytest.raises(ValueError, match="num_classes"):
        write_standin("rte", tmp_path, num_classes=3)


def test_glue_unlabelled_test_split_is_written_but_not_read(tmp_path):
    import datasets

    split = standin("mnli", tmp_path)
    on_disk = datasets.load_from_disk(str(tmp_path / "glue" / "mnli"))
    assert set(on_disk) == {"train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched"}
    assert set(on_disk["test_matched"]["label"]) == {-1}
    assert len(split.test_labels) == on_disk["validation_matched"].num_rows
    assert split.render(split.test_refs[:1], 0)[0] == (on_disk["validation_matched"][0]["premise"],
                                                        on_disk["validation_matched"][0]["hypothesis"])


# ---------------------------------------------------------------- torchvision reads the same stand-ins


def by_path(samples):
    return {str(path): int(label) for path, label in samples}


def ours(split):
    return (dict(zip(split.train_refs, split.train_labels.tolist())),
            dict(zip(split.test_refs, split.test_labels.tolist())))


def test_torchvision_mnist_reads_the_standin(tmp_path):
    from torchvision import datasets as tv

    split = standin("mnist", tmp_path)
    for refs, labels, train in ((split.train_refs, split.train_labels, True),
                                (split.test_refs, split.test_labels, False)):
        theirs = tv.MNIST(tmp_path / "mnist", train=train)
        assert theirs.targets.numpy().tolist() == labels.tolist()
        assert np.array_equal(theirs.data.numpy(), np.asarray(paper_split._mnist_pixels(refs.path)))


def test_torchvision_svhn_reads_the_standin(tmp_path, monkeypatch):
    from torchvision import datasets as tv

    # torchvision's SVHN checks the real files' md5, which a stand-in cannot match; only that check is bypassed.
    monkeypatch.setattr(tv.SVHN, "_check_integrity", lambda self: True)
    split = standin("svhn", tmp_path)
    for labels, part in ((split.train_labels, "train"), (split.test_labels, "test")):
        theirs = tv.SVHN(tmp_path / "svhn", split=part)
        assert theirs.labels.tolist() == labels.tolist()  # label 10 read as 0 on both sides
    image, _ = theirs[0]
    pixels = paper_split._svhn_pixels(split.test_refs.path, paper_split._stamp(split.test_refs.path))
    assert np.array_equal(np.asarray(image), np.asarray(pixels[0]))


def test_torchvision_gtsrb_reads_the_standin(tmp_path):
    from torchvision import datasets as tv

    train, test = ours(standin("gtsrb", tmp_path))
    assert by_path(tv.GTSRB(tmp_path, split="train")._samples) == train
    assert by_path(tv.GTSRB(tmp_path, split="test")._samples) == test


def test_torchvision_dtd_reads_the_standin(tmp_path):
    from torchvision import datasets as tv

    split = standin("dtd", tmp_path)
    train, test = ours(split)
    theirs = {part: tv.DTD(tmp_path, split=part, partition=1) for part in ("train", "val", "test")}
    assert {**by_path(zip(theirs["train"]._image_files, theirs["train"]._labels)),
            **by_path(zip(theirs["val"]._image_files, theirs["val"]._labels))} == train
    assert by_path(zip(theirs["test"]._image_files, theirs["test"]._labels)) == test
    assert len(theirs["val"]) > 0  # train really is train1 + val1
    assert tuple(theirs["test"].classes) == split.class_names


def test_torchvision_stanford_cars_reads_the_standin(tmp_path):
    from torchvision import datasets as tv

    split = standin("cars", tmp_path)
    train, test = ours(split)
    theirs = tv.StanfordCars(tmp_path, split="train")
    assert by_path(theirs._samples) == train
    assert by_path(tv.StanfordCars(tmp_path, split="test")._samples) == test
    assert tuple(theirs.classes) == split.class_names


def test_torchvision_eurosat_and_sun397_read_the_standins(tmp_path):
    from torchvision import datasets as tv

    train, test = ours(standin("eurosat", tmp_path))
    everything = by_path(tv.EuroSAT(tmp_path).samples)
    assert {path: everything[path] for path in [*train, *test]} == {**train, **test}
    assert len(everything) == len(train) + len(test) + K  # plus one val image per class

    split = standin("sun397", tmp_path)
    train, test = ours(split)
    theirs = tv.SUN397(tmp_path / "sun397")
    everything = by_path(zip(theirs._image_files, theirs._labels))
    assert {path: everything[path] for path in [*train, *test]} == {**train, **test}
    assert len(everything) == len(train) + len(test) + K  # images outside partition 01 are not read
    assert [c.replace("/", " ").replace("_", " ") for c in theirs.classes] == list(split.class_names)


def test_resisc45_reads_like_torchgeo(tmp_path):
    from torchvision.datasets import ImageFolder

    train, test = ours(standin("resisc45", tmp_path))
    for wanted, part in ((train, "train"), (test, "test")):
        # torchgeo's RESISC45: an ImageFolder keeping the files whose base name the split file lists
        listed = set((tmp_path / "resisc45" / f"resisc45-{part}.txt").read_text().split())
        theirs = ImageFolder(tmp_path / "resisc45" / "NWPU-RESISC45",
                             is_valid_file=lambda p: p.split("/")[-1] in listed)
        assert by_path(theirs.samples) == wanted


# ---------------------------------------------------------------- EuroSAT split


def test_eurosat_split_has_the_literature_sizes_and_is_stable():
    sizes = {"AnnualCrop": 3000, "Forest": 3000, "HerbaceousVegetation": 3000, "Highway": 2500, "Industrial": 2500,
             "Pasture": 2000, "PermanentCrop": 2500, "Residential": 3000, "River": 2500, "SeaLake": 3000}
    n_train = n_test = 0
    for cls, n in sizes.items():
        files = [f"{cls}_{i + 1}.jpg" for i in range(n)]
        train, test = paper_vision._eurosat_split(files)
        assert not set(train) & set(test)
        assert (train, test) == paper_vision._eurosat_split(files[::-1])  # listing order does not matter
        n_train, n_test = n_train + len(train), n_test + len(test)
    assert (n_train, n_test) == (21_600, 2_700)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ["mnist", "dtd", "sun397", "cars", "rte"])
def test_missing_data_error_says_what_and_how(name, tmp_path):
    with pytest.raises(MissingDataError) as caught:
        read_split(name, tmp_path)
    message = str(caught.value)
    assert name in message and str(tmp_path) in message and "prepare-data" in message
    assert str(paper.dataset_dir(name, tmp_path)) in message  # the exact path looked at
    assert isinstance(caught.value, FileNotFoundError)


def test_unknown_task_lists_the_known_ones(tmp_path):
    for function in (read_split, write_standin, paper.download):
        with pytest.raises(ValueError, match="unknown paper task 'imagenet'.*sun397.*rte"):
            function("imagenet", tmp_path)


def test_truncated_idx_file_is_named(tmp_path):
    write_standin("mnist", tmp_path, num_classes=K)
    images = tmp_path / "mnist" / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-5])
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.*truncated"):
        read_split("mnist", tmp_path)


@pytest.mark.parametrize("name, remove", [
    ("dtd", "dtd/dtd/images/blotchy/blotchy_0001.jpg"),
    ("resisc45", "resisc45/NWPU-RESISC45/airport/airport_006.jpg"),
    ("gtsrb", "gtsrb/GTSRB/Final_Test/Images/00001.ppm"),
])
def test_split_file_naming_a_missing_image_is_named(name, remove, tmp_path):
    write_standin(name, tmp_path, num_classes=K)
    (tmp_path / remove).unlink()
    with pytest.raises(MissingDataError, match=remove.split("/")[-1]) as caught:
        read_split(name, tmp_path)
    assert {"dtd": "test1.txt", "resisc45": "resisc45-test.txt",
            "gtsrb": "GT-final_test.csv"}[name] in str(caught.value)


def test_malformed_files_are_named(tmp_path):
    write_standin("gtsrb", tmp_path, num_classes=K)
    gt = tmp_path / "gtsrb" / "GT-final_test.csv"
    gt.write_text(gt.read_text().replace("ClassId", "Class"))
    with pytest.raises(ValueError, match="GT-final_test.csv"):
        read_split("gtsrb", tmp_path)

    write_standin("svhn", tmp_path, num_classes=K)
    (tmp_path / "svhn" / "test_32x32.mat").write_bytes(b"not a mat file")
    with pytest.raises(ValueError, match="test_32x32.mat"):
        read_split("svhn", tmp_path)

    import datasets

    write_standin("cola", tmp_path)
    broken = datasets.load_from_disk(str(tmp_path / "glue" / "cola")).rename_column("sentence", "text")
    broken.save_to_disk(str(tmp_path / "other" / "glue" / "cola"))
    with pytest.raises(ValueError, match=r"other/glue/cola/train: missing column.*sentence"):
        read_split("cola", tmp_path / "other")


def test_train_test_overlap_is_refused(tmp_path):
    write_standin("resisc45", tmp_path, num_classes=K)
    test_list = tmp_path / "resisc45" / "resisc45-test.txt"
    test_list.write_text(test_list.read_text() + "airplane_001.jpg\n")
    with pytest.raises(ValueError, match="both train and test"):
        read_split("resisc45", tmp_path)


def test_cars_download_explains_the_manual_route(tmp_path):
    with pytest.raises(RuntimeError, match="cannot be downloaded.*stanford_cars/devkit/cars_meta.mat"):
        paper.download("cars", tmp_path)


# ---------------------------------------------------------------- rendering


def tv_eval_crop(image, size):
    from torchvision import transforms as T

    crop = T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(size)])
    return np.asarray(crop(image.convert("RGB"))).transpose(2, 0, 1)


@pytest.mark.parametrize("width, height, mode", [(37, 23, "RGB"), (23, 37, "L"), (20, 20, "RGB"), (9, 50, "P")])
def test_render_is_clips_resize_and_centre_crop(width, height, mode, tmp_path):
    rng = np.random.default_rng(width * height)
    pixels = rng.integers(0, 256, (height, width, 3) if mode == "RGB" else (height, width), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB" if mode == "RGB" else "L")
    if mode == "P":
        image = image.convert("P")
    path = tmp_path / "known.png"
    image.save(path)
    split = standin("dtd", tmp_path / "data", num_classes=2)
    for size in (16, 15):
        rendered = split.render(np.array([str(path)], dtype=object), size)
        assert rendered.dtype == np.uint8 and rendered.shape == (1, 3, size, size)
        assert np.array_equal(rendered[0], tv_eval_crop(Image.open(path), size))
    if mode == "L":
        assert np.array_equal(rendered[0, 0], rendered[0, 2])  # grayscale repeated to three channels


def test_render_of_array_backed_refs_matches_torchvision(tmp_path):
    from torchvision import datasets as tv

    split = standin("mnist", tmp_path)
    chunk = split.test_refs[np.array([4, 1])]
    theirs = tv.MNIST(tmp_path / "mnist", train=False)
    rendered = split.render(chunk, 24)
    for out, row in zip(rendered, [4, 1]):
        assert np.array_equal(out, tv_eval_crop(theirs[row][0], 24))


def test_array_refs_index_like_arrays():
    refs = ArrayRefs("x", "idx", np.arange(10))
    assert refs[2:5].rows.tolist() == [2, 3, 4]
    assert refs[np.array([7, 1])].rows.tolist() == [7, 1]
    assert refs[refs.rows % 2 == 0].rows.tolist() == [0, 2, 4, 6, 8]
    assert refs[3].rows.tolist() == [3] and len(refs[3]) == 1


def test_unreadable_image_is_named(tmp_path):
    split = standin("dtd", tmp_path, num_classes=2)
    broken = split.train_refs[0]
    with open(broken, "wb") as handle:
        handle.write(b"garbage")
    with pytest.raises(ValueError, match=broken.split("/")[-1]):
        split.render(split.train_refs[:2], 8)


# ---------------------------------------------------------------- zero-shot prompts


def test_zeroshot_templates_are_task_vectors():
    assert set(Z.TEMPLATES) == set(VISION_TASKS)
    counts = {task: len(templates) for task, templates in Z.TEMPLATES.items()}
    assert counts == {"sun397": 2, "cars": 8, "resisc45": 18, "eurosat": 3, "svhn": 1, "gtsrb": 3, "mnist": 1, "dtd": 8}
    assert Z.prompts("eurosat", "forest") == ["a centered satellite photo of forest.",
                                              "a centered satellite photo of a forest.",
                                              "a centered satellite photo of the forest."]
    assert Z.prompts("mnist", "7") == ['a photo of the number: "7".']
    assert Z.prompts("cars", "x")[3] == "i love my x!"
    with pytest.raises(ValueError, match="known: sun397"):
        Z.prompts("cola", "acceptable")
