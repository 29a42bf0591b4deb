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


def _check_table_path(where: str, path: Path) -> None:
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise OwnTaskError(f"{where}: {path} is not a table dpmerge reads (expected {', '.join(TABLE_SUFFIXES)})")
    if not path.is_file():
        raise OwnTaskError(f"{where}: no such file: {path}")


def modality_of(entry: dict) -> str:
    return "vision" if "images" in entry else "text"
