"""Reader of the paper's eight GLUE tasks (Wang et al., "GLUE: A Multi-Task Benchmark and Analysis Platform for
Natural Language Understanding", arXiv:1804.07461), as `datasets.DatasetDict.save_to_disk` writes the Hugging
Face dataset nyu-mll/glue.

GLUE's test labels are hidden, so the literature reports the validation split: :func:`glue_splits` names the
two splits read. standins.py writes stand-ins with the same columns and label names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpmerge.data.paper_split import PaperSplit, require_paths
from dpmerge.data.registry import TASKS

__all__ = ["GLUE_COLUMNS", "GLUE_LABELS", "glue_splits", "read_glue"]


# GLUE columns (nyu-mll/glue) and label names; stsb's label is a float score.
GLUE_COLUMNS = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
}
GLUE_LABELS = {
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
}
_STSB_NAMES = ("similarity",)


def glue_splits(name: str) -> tuple[str, str]:
    return "train", "validation_matched" if name == "mnli" else "validation"


def read_glue(name: str, data_dir: Path) -> PaperSplit:
    path = data_dir / "glue" / name
    require_paths(name, data_dir, path / "dataset_dict.json")
    import datasets

    try:
        splits = datasets.load_from_disk(str(path))
    except Exception as error:  # datasets raises many types for a damaged directory; all mean the same here
        raise ValueError(f"{path}: not readable by datasets.load_from_disk ({error})") from error
    if not isinstance(splits, datasets.DatasetDict):
        raise ValueError(f"{path}: holds a {type(splits).__name__}, not a DatasetDict of GLUE splits")
    columns = GLUE_COLUMNS[name]
    refs, labels, class_names = [], [], _STSB_NAMES
    for split in glue_splits(name):
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
    kind = TASKS[name].input_kind
    return PaperSplit(class_names, refs[0], labels[0], refs[1], labels[1], input_kind=kind)
