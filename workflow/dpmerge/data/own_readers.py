"""Reading an own task's data (data/own.py declares the format): image folders, tables and saved datasets become
the paper readers' PaperSplit (references rendered chunk by chunk), with class names and labels checked and
every error naming the file, the column or the row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from dpmerge.data.fixed_split import split_rng
from dpmerge.data.own import IMAGE_SUFFIXES, OwnTaskError, check_entry
from dpmerge.data.paper_split import PaperSplit
from dpmerge.data.registry import TaskSpec


def read_own_task(name: str, entry: dict):
    """(TaskSpec, PaperSplit) of own task `name`: its classes inferred or declared, its train and test examples."""
    entry = check_entry(name, entry)
    source = entry["source"]
    if source == "images":
        class_names, split, provenance = read_images(name, entry)
        input_kind = "image"
    else:
        class_names, split, provenance = read_rows(name, entry)
        input_kind = "pair" if "text_pair" in entry else "single"
    spec = TaskSpec(
        name=name, modality="vision" if input_kind == "image" else "text", input_kind=input_kind,
        num_classes=1 if entry["metric"] == "spearman" else len(class_names), metric=entry["metric"],
        description=f"own task read from {entry[source]}", provenance=provenance,
        licence="the researcher's own data",
    )
    return spec, split


def training_examples(name: str, entry: dict) -> int:
    """N of own task `name`: its training examples as `prepare` reads them (before data.max_train), every file
    read and checked as there (an unreadable image, a stray file, an empty text or a bad label refused by name).
    The config check calls it before any job; images are verified, not decoded."""
    return len(read_own_task(name, entry)[1].train_labels)


def read_images(name: str, entry: dict) -> tuple[list[str], PaperSplit, str]:
    folder = Path(entry["images"])
    train_dir, test_dir = folder / "train", folder / "test"
    if train_dir.is_dir() != test_dir.is_dir():
        present, absent = (train_dir, test_dir) if train_dir.is_dir() else (test_dir, train_dir)
        raise OwnTaskError(f"own_tasks.{name}: {folder} has {present.name}/ but no {absent.name}/; give both, or "
                           "put the class folders directly in it for a held-out test split")
    if train_dir.is_dir():
        train, test = _class_folders(train_dir), _class_folders(test_dir)
        unseen = sorted(set(test) - set(train))
        if unseen:
            raise OwnTaskError(f"own_tasks.{name}: {test_dir / unseen[0]} is a class that {train_dir} does not have")
        classes = _ordered_classes(name, entry, train)
        train_refs, train_labels = _flatten(train, classes)
        test_refs, test_labels = _flatten(test, classes)
        provenance = f"{folder}: its train/ and test/ class folders"
    else:
        every = _class_folders(folder)
        classes = _ordered_classes(name, entry, every)
        refs, labels = _flatten(every, classes)
        train_index, test_index = held_out(name, labels, entry["test_fraction"], classification=True)
        train_refs, train_labels, test_refs, test_labels = (refs[train_index], labels[train_index],
                                                            refs[test_index], labels[test_index])
        provenance = f"{folder}: class folders, a fixed {entry['test_fraction']:g} of each class held out as test"
    for path in [*train_refs, *test_refs]:
        _check_readable(path)
    split = PaperSplit(tuple(classes), train_refs, train_labels, test_refs, test_labels, "image")
    return classes, split, provenance


def _class_folders(folder: Path) -> dict[str, list[str]]:
    classes = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            raise OwnTaskError(f"{entry}: images go in one subfolder per class (e.g. {folder / 'cat' / entry.name})")
        files = []
        for path in sorted(entry.rglob("*")):
            if path.name.startswith(".") or path.is_dir():
                continue
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                raise OwnTaskError(f"{path}: not an image file (expected {', '.join(IMAGE_SUFFIXES)})")
            files.append(str(path))
        if not files:
            raise OwnTaskError(f"{entry}: class folder without images")
        classes[entry.name] = files
    if len(classes) < 2:
        raise OwnTaskError(f"{folder}: {len(classes)} class folder(s) ({', '.join(classes) or 'none'}); a task needs "
                           "two or more classes, one subfolder each")
    return classes


def _ordered_classes(name: str, entry: dict, folders: dict) -> list[str]:
    declared = entry.get("classes")
    if declared is None:
        return sorted(folders)
    declared = [str(c) for c in declared]
    if set(declared) != set(folders):
        raise OwnTaskError(f"own_tasks.{name}.classes: {declared} are not the class folders "
                           f"{sorted(folders)} of {entry['images']}")
    return declared


def _flatten(folders: dict[str, list[str]], classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    refs = [path for name in classes for path in folders.get(name, [])]
    labels = [index for index, name in enumerate(classes) for _ in folders.get(name, [])]
    return np.array(refs, dtype=object), np.array(labels, dtype=np.int64)


def _check_readable(path: str) -> None:
    try:
        with Image.open(path) as image:
            image.verify()  # the header and structure, without decoding every pixel
    except Exception as error:  # PIL raises many types for a broken file; each is the same problem here
        raise OwnTaskError(f"{path}: not a readable image ({type(error).__name__}: {error})") from None


def held_out(name: str, labels: np.ndarray, fraction: float, classification: bool) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices of a fixed split: `fraction` of each class (of all examples for a regression task)
    held out, drawn with the task's constant seed; a class keeps at least one example on each side."""
    rng = split_rng(name)
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)] if classification else [np.arange(len(labels))]
    train, test = [], []
    for members in groups:
        members = rng.permutation(members)
        count = int(round(fraction * len(members)))
        count = min(max(count, 1), len(members) - 1) if len(members) >= 2 else 0
        test.append(members[:count])
        train.append(members[count:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def read_rows(name: str, entry: dict) -> tuple[list[str], PaperSplit, str]:
    """A table's or a saved dataset's rows as texts (or text pairs) and labels."""
    columns = {"text": entry.get("text", "text"), "label": entry.get("label", "label")}
    if "text_pair" in entry:
        columns["text_pair"] = entry["text_pair"]
    if entry["source"] == "table":
        train = _read_table(Path(entry["table"]))
        test = _read_table(Path(entry["test"])) if "test" in entry else None
        train_where, test_where = str(entry["table"]), str(entry.get("test"))
        feature_names = None
        provenance = f"{entry['table']}" + (f", test {entry['test']}" if "test" in entry else "")
    else:
        train, test, feature_names, train_where, test_where, provenance = _read_dataset(name, entry, columns)
    for frame, where in ((train, train_where), (test, test_where)):
        if frame is None:
            continue
        missing = [column for column in columns.values() if column not in frame.columns]
        if missing:
            raise OwnTaskError(f"{where}: no column {missing[0]!r} (columns: {', '.join(map(str, frame.columns))}); "
                               f"name it with own_tasks.{name}.{_field_of(columns, missing[0])}")
    classes, train_labels, test_labels = encode_labels(
        train[columns["label"]].tolist(), None if test is None else test[columns["label"]].tolist(),
        entry, feature_names, train_where, test_where)
    train_refs = _texts(train, columns, train_where)
    if test is None:
        train_index, test_index = held_out(name, train_labels, entry["test_fraction"],
                                           classification=entry["metric"] != "spearman")
        train_refs, test_refs = train_refs[train_index], train_refs[test_index]
        train_labels, test_labels = train_labels[train_index], train_labels[test_index]
        provenance += f", a fixed {entry['test_fraction']:g} held out as test"
    else:
        test_refs = _texts(test, columns, test_where)
    split = PaperSplit(tuple(classes), train_refs, train_labels, test_refs, test_labels,
                       "pair" if "text_pair" in columns else "single")
    return classes, split, provenance


def _field_of(columns: dict, column: str) -> str:
    return next(field for field, name in columns.items() if name == column)


def _read_table(path: Path):
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path, keep_default_na=False, na_values=[""])
        if suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_json(path, lines=True, dtype=False)
    except Exception as error:  # pandas' parsers raise many types; each means an unreadable table
        raise OwnTaskError(f"{path}: not a readable {suffix[1:]} table ({type(error).__name__}: {error})") from None


def _read_dataset(name: str, entry: dict, columns: dict):
    from datasets import ClassLabel, Dataset, DatasetDict, load_from_disk

    path = str(entry["dataset"])
    try:
        loaded = load_from_disk(path)
    except Exception as error:  # not a save_to_disk folder: the library says why
        raise OwnTaskError(f"{path}: not a dataset saved by the datasets library ({type(error).__name__}: "
                           f"{error})") from None
    test_split = entry.get("test_split", "test")
    if isinstance(loaded, DatasetDict):
        if "train" not in loaded:
            raise OwnTaskError(f"{path}: the saved DatasetDict has no 'train' split (splits: {', '.join(loaded)})")
        if "test_split" in entry and test_split not in loaded:
            raise OwnTaskError(f"own_tasks.{name}.test_split: {path} has no split {test_split!r} (splits: "
                               f"{', '.join(loaded)})")
        train, test = loaded["train"], loaded[test_split] if test_split in loaded else None
    elif isinstance(loaded, Dataset):
        if "test_split" in entry:
            raise OwnTaskError(f"own_tasks.{name}.test_split: {path} is one Dataset, without splits")
        train, test = loaded, None
    else:
        raise OwnTaskError(f"{path}: expected a Dataset or DatasetDict, got {type(loaded).__name__}")
    feature = train.features.get(columns["label"])
    names = list(feature.names) if isinstance(feature, ClassLabel) else None
    frames = [None if split is None else split.to_pandas() for split in (train, test)]
    used = f"{path} (split {test_split})"
    provenance = f"{path}: its train split" + (f", test split {test_split}" if test is not None else "")
    return frames[0], frames[1], names, f"{path} (split train)", used, provenance


def _texts(frame, columns: dict, where: str) -> np.ndarray:
    fields = ["text", "text_pair"] if "text_pair" in columns else ["text"]
    values = []
    for field in fields:
        column = frame[columns[field]].tolist()
        for row, value in enumerate(column):
            if not isinstance(value, str) or not value.strip():
                raise OwnTaskError(f"{where}: row {row + 1}, column {columns[field]!r}: expected text, got "
                                   f"{value!r}")
        values.append(column)
    refs = np.empty((len(values[0]), len(values)), dtype=object) if len(values) == 2 else np.empty(len(values[0]),
                                                                                                    dtype=object)
    if len(values) == 2:
        refs[:, 0], refs[:, 1] = values
    else:
        refs[:] = values[0]
    return refs


def _is_integer(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return isinstance(value, (float, np.floating)) and float(value).is_integer()


def encode_labels(train: list, test: list | None, entry: dict, feature_names: list[str] | None, train_where: str,
                  test_where: str) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """Class names and integer labels (float targets for a regression task) of the train and test rows."""
    column = entry.get("label", "label")
    for values, where in ((train, train_where), (test or [], test_where)):
        for row, value in enumerate(values):
            if value is None or (isinstance(value, float) and np.isnan(value)):
                raise OwnTaskError(f"{where}: row {row + 1}, column {column!r}: no label")
    if entry["metric"] == "spearman":
        for values, where in ((train, train_where), (test or [], test_where)):
            for row, value in enumerate(values):
                if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                    raise OwnTaskError(f"{where}: row {row + 1}, column {column!r}: a regression target must be a "
                                       f"number, got {value!r}")
        as_float = [np.asarray(v, dtype=np.float32) if v is not None else None for v in (train, test)]
        return [], as_float[0], as_float[1]
    classes = feature_names or ([str(c) for c in entry["classes"]] if entry.get("classes") else None)
    if classes is None:
        if all(_is_integer(value) for value in [*train, *(test or [])]):
            classes = [str(value) for value in sorted({int(value) for value in train})]
        elif all(isinstance(value, str) for value in [*train, *(test or [])]):
            classes = sorted(set(train))
        else:
            values, where = (train, train_where)
            bad = next(i for i, v in enumerate(values) if not isinstance(v, str) and not _is_integer(v))
            raise OwnTaskError(f"{where}: row {bad + 1}, column {column!r}: labels must be class names or integers, "
                               f"got {values[bad]!r}")
    index = {name: position for position, name in enumerate(classes)}
    declared = feature_names is not None or entry.get("classes") is not None

    def encoded(values: list, where: str) -> np.ndarray:
        out = np.empty(len(values), dtype=np.int64)
        for row, value in enumerate(values):
            if _is_integer(value) and declared and 0 <= int(value) < len(classes) and str(value) not in index:
                out[row] = int(value)  # an index into the declared names
            elif str(int(value) if _is_integer(value) else value) in index:
                out[row] = index[str(int(value) if _is_integer(value) else value)]
            else:
                raise OwnTaskError(f"{where}: row {row + 1}, column {column!r}: label {value!r} is not one of the "
                                   f"classes {classes}" + ("" if declared else " seen in training"))
        return out

    train_labels = encoded(train, train_where)
    if len(np.unique(train_labels)) < 2:
        raise OwnTaskError(f"{train_where}: column {column!r} holds one class ({classes[int(train_labels[0])]!r}); a "
                           "task needs two or more")
    return classes, train_labels, None if test is None else encoded(test, test_where)
