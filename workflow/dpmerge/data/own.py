"""A researcher's own tasks, declared in the config under `own_tasks:` and read without editing the package.

Three sources, one key each:

- ``images: FOLDER``: one subfolder of images per class (its name is the class name); or ``train/`` and ``test/``
  subfolders, each with one subfolder per class. Images are read with PIL and rendered like the paper's (the
  shorter side resized, the centre crop), grayscale or RGBA made RGB.
- ``table: FILE`` (.csv, .parquet, .jsonl): one example per row, the columns named by ``text`` (default "text"),
  ``text_pair`` (optional: a sentence-pair task) and ``label`` (default "label"); ``test: FILE`` is the test split
  in the same format.
- ``dataset: FOLDER``: a dataset saved by the `datasets` library (`save_to_disk`): a DatasetDict's ``train`` split
  and its ``test_split`` (default "test"), or one Dataset. ClassLabel columns keep their names.

Without a test split (no ``test/`` folder, no ``test`` file, no ``test_split`` in the DatasetDict) a fixed,
per-class ``test_fraction`` (default 0.2) of the examples is held out, drawn with the task's constant seed, so
every run evaluates on the same examples. Labels are class names or integers (``classes`` may list the names in
order; integer labels then index them), or numbers for a regression task (``metric: spearman``). ``metric``
defaults to accuracy. Every check names the file and the column or row at fault.

`check_entry` is the config check's part (standard library only: it runs while Snakemake parses the rules);
own_readers.read_own_task reads the data, in `dpmerge prepare`.
"""

from __future__ import annotations

from pathlib import Path

from dpmerge.metrics import METRICS

SOURCES = ("images", "table", "dataset")
FIELDS = {*SOURCES, "text", "text_pair", "label", "test", "test_split", "test_fraction", "metric", "classes"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
TABLE_SUFFIXES = (".csv", ".parquet", ".jsonl")
DEFAULT_TEST_FRACTION = 0.2


class OwnTaskError(ValueError):
    """An own task's declaration or data is not usable; the message names the task, the file and what is wrong."""


def check_entry(name: str, entry) -> dict:
    """The declaration of own task `name`, checked without reading the data: known fields, exactly one source that
    exists, a known metric, a test fraction in (0, 1), fields that fit the source. Returns it with its defaults."""
    where = f"own_tasks.{name}"
    if not isinstance(entry, dict):
        raise OwnTaskError(f"{where}: expected a mapping with one of {', '.join(SOURCES)}, got {entry!r}")
    unknown = sorted(set(entry) - FIELDS)
    if unknown:
        raise OwnTaskError(f"{where}.{unknown[0]}: unknown field; an own task takes {', '.join(sorted(FIELDS))}")
    sources = [key for key in SOURCES if key in entry]
    if len(sources) != 1:
        raise OwnTaskError(f"{where}: give exactly one of {', '.join(SOURCES)} (the data's folder or file), got "
                           f"{', '.join(sources) or 'none'}")
    source = sources[0]
    path = Path(str(entry[source]))
    if source in ("images", "dataset") and not path.is_dir():
        raise OwnTaskError(f"{where}.{source}: {path} is not a folder")
    if source == "table":
        _check_table_path(f"{where}.table", path)
        if "test" in entry:
            _check_table_path(f"{where}.test", Path(str(entry["test"])))
    elif "test" in entry:
        raise OwnTaskError(f"{where}.test: a test file goes with `table`; an image folder's test split is its test/ "
                           "subfolder, a saved dataset's its test_split")
    if source == "images":
        for field in ("text", "text_pair", "label", "test_split"):
            if field in entry:
                raise OwnTaskError(f"{where}.{field}: not a field of an image folder (its classes are subfolders)")
    elif "test_split" in entry and source != "dataset":
        raise OwnTaskError(f"{where}.test_split: goes with `dataset` (a DatasetDict's split name)")
    metric = entry.get("metric", "accuracy")
    if metric not in METRICS:
        raise OwnTaskError(f"{where}.metric: {metric!r} is not a metric; known: {', '.join(METRICS)}")
    fraction = entry.get("test_fraction", DEFAULT_TEST_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise OwnTaskError(f"{where}.test_fraction: expected a number in (0, 1), got {fraction!r}")
    for field in ("text", "text_pair", "label"):
        if field in entry and not (isinstance(entry[field], str) and entry[field]):
            raise OwnTaskError(f"{where}.{field}: expected a column name, got {entry[field]!r}")
    classes = entry.get("classes")
    if classes is not None and not (isinstance(classes, list) and len(classes) >= 2
                                    and len(set(map(str, classes))) == len(classes)):
        raise OwnTaskError(f"{where}.classes: expected a list of two or more distinct class names, got {classes!r}")
    if metric == "spearman" and classes is not None:
        raise OwnTaskError(f"{where}.classes: a regression task (metric spearman) has no classes")
    return {"metric": metric, "test_fraction": fraction, **entry, "source": source}


def check_data(name: str, entry: dict) -> None:
    """What the config check reads of an own task's data first (after `check_entry`), with the messages a
    researcher meets most: a CSV or JSON-lines table's columns and its number of labels, an image folder's number
    of classes. The config check then reads the whole task as `prepare` will (own_readers.training_examples)."""
    where, metric = f"own_tasks.{name}", entry.get("metric", "accuracy")
    if "table" in entry:
        for field in ("table", "test") if "test" in entry else ("table",):
            # a test file may hold fewer classes than the training table; the columns it must have
            _check_table_content(f"{where}.{field}", Path(str(entry[field])), entry,
                                 regression=metric == "spearman" or field == "test")
    elif "images" in entry:
        _check_image_classes(f"{where}.images", Path(str(entry["images"])))


def _check_table_content(where: str, path: Path, entry: dict, *, regression: bool) -> None:
    """What a CSV or JSON-lines table must hold, read before any job (a Parquet table is read by `prepare`): the
    columns the task names, and for a classification task two or more labels."""
    import csv
    import json

    if path.suffix.lower() == ".parquet":
        return
    wanted = [entry.get("text", "text"), entry.get("label", "label")] + \
        ([entry["text_pair"]] if "text_pair" in entry else [])
    labels, columns = set(), None
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            if path.suffix.lower() == ".csv":
                reader = csv.DictReader(handle)
                columns = reader.fieldnames or []
                rows = reader
            else:
                rows = (json.loads(line) for line in handle if line.strip())
            for number, row in enumerate(rows, start=1):
                if columns is None:
                    columns = list(row) if isinstance(row, dict) else []
                if not isinstance(row, dict):
                    raise OwnTaskError(f"{where}: {path}, row {number}: not a JSON object")
                missing = [column for column in wanted if column not in row]
                if missing:
                    break
                labels.add(str(row[wanted[1]]))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        if isinstance(error, OwnTaskError):
            raise
        raise OwnTaskError(f"{where}: {path} cannot be read as a {path.suffix} table ({error})") from None
    missing = [column for column in wanted if column not in (columns or [])]
    if missing:
        raise OwnTaskError(f"{where}: {path} has no column {missing[0]!r} (its columns: {', '.join(columns or [])}); "
                           f"name the right one with own task fields text / label / text_pair")
    if not regression and len(labels) < 2 and "classes" not in entry:
        raise OwnTaskError(f"{where}: {path} holds {len(labels)} distinct label(s) in column {wanted[1]!r}; a "
                           "classification task needs two or more (metric: spearman for a regression task)")


def _check_image_classes(where: str, folder: Path) -> None:
    """An image folder's classes: its subfolders (those of train/ where train/ and test/ split it)."""
    root = folder / "train" if (folder / "train").is_dir() and (folder / "test").is_dir() else folder
    classes = [child.name for child in sorted(root.iterdir()) if child.is_dir()]
    if len(classes) < 2:
        raise OwnTaskError(f"{where}: {root} has {len(classes)} class subfolder(s) ({', '.join(classes) or 'none'}); "
                           "a task needs two or more, one subfolder of images per class")


def _check_table_path(where: str, path: Path) -> None:
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise OwnTaskError(f"{where}: {path} is not a table dpmerge reads (expected {', '.join(TABLE_SUFFIXES)})")
    if not path.is_file():
        raise OwnTaskError(f"{where}: no such file: {path}")


def modality_of(entry: dict) -> str:
    return "vision" if "images" in entry else "text"
