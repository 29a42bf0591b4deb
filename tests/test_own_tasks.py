"""A researcher's own tasks (config own_tasks, dpmerge/data/own.py): an image folder, a CSV, JSONL or Parquet table
of texts, a dataset saved by the `datasets` library; their classes inferred or declared, their errors naming the
file, the column or the row; and a study on them from the config to the answer page and the ledger."""

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import install_test_key
from dpmerge.config_check import ConfigError, check_config
from dpmerge.data.loading import load_task
from tiny_files import (
    write_image_folder,
    write_tiny_bert,
    write_tiny_resnet,
)
from workflow_runs import SNAKEMAKE, TINY, snakemake_env


def sentences(count=40):
    rows = []
    for index in range(count):
        rows.append({"review": f"a wonderful and moving film, number {index}", "stars": "good"})
        rows.append({"review": f"a dull and tiresome film, number {index}", "stars": "bad"})
    return pd.DataFrame(rows)


def test_an_image_folder_is_split_per_class_with_a_fixed_seed(tmp_path):
    folder = write_image_folder(tmp_path / "shapes")
    task = load_task("shapes", own={"images": str(folder), "test_fraction": 0.25}, image_size=16)
    assert task.class_names == ["blue", "red"] and task.spec.num_classes == 2 and task.spec.modality == "vision"
    assert np.bincount(task.test_labels).tolist() == [3, 3] and len(task.train_labels) == 18
    pixels = task.train_inputs[0:4]
    assert pixels.shape == (4, 3, 16, 16) and pixels.dtype == np.uint8
    blue_first = int(np.flatnonzero(task.train_labels == 0)[0])
    assert pixels[blue_first, 2].mean() > pixels[blue_first, 0].mean()  # a blue image is blue
    again = load_task("shapes", own={"images": str(folder), "test_fraction": 0.25}, image_size=16, seed=3)
    assert again.test_labels.tolist() == task.test_labels.tolist()  # the split is the task's, not the seed's


def test_train_and_test_folders_are_the_split(tmp_path):
    folder = write_image_folder(tmp_path / "shapes", split=True)
    task = load_task("split_shapes", own={"images": str(folder)}, image_size=8)
    assert (len(task.train_labels), len(task.test_labels)) == (24, 12)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_table_of_sentences_in_each_format(tmp_path, suffix):
    path = tmp_path / f"reviews{suffix}"
    frame = sentences()
    {".csv": lambda: frame.to_csv(path, index=False), ".jsonl": lambda: frame.to_json(path, orient="records",
                                                                                       lines=True),
     ".parquet": lambda: frame.to_parquet(path)}[suffix]()
    task = load_task("reviews", own={"table": str(path), "text": "review", "label": "stars", "metric": "f1"})
    assert task.class_names == ["bad", "good"] and task.spec.metric == "f1" and task.spec.input_kind == "single"
    assert len(task.train_labels) + len(task.test_labels) == 80 and np.bincount(task.test_labels).tolist() == [8, 8]
    assert all(isinstance(text, str) and "film" in text for text in task.train_inputs)


def test_sentence_pairs_with_integer_labels_and_declared_names(tmp_path):
    frame = pd.DataFrame({"first": [f"s{i}" for i in range(20)], "second": [f"t{i}" for i in range(20)],
                          "label": [i % 2 for i in range(20)]})
    frame.to_csv(tmp_path / "pairs.csv", index=False)
    task = load_task("pairs", own={"table": str(tmp_path / "pairs.csv"), "text": "first", "text_pair": "second",
                                   "classes": ["different", "same"]})
    assert task.class_names == ["different", "same"] and task.spec.input_kind == "pair"
    assert all(isinstance(pair, tuple) and len(pair) == 2 for pair in task.train_inputs)


def test_a_saved_dataset_keeps_its_class_names_and_test_split(tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    rows = sentences(10)
    parts = {split: Dataset.from_dict({"text": rows["review"].tolist(),
                                       "label": [int(s == "good") for s in rows["stars"]]}, features=features)
             for split in ("train", "test")}
    DatasetDict(parts).save_to_disk(str(tmp_path / "saved"))
    task = load_task("saved", own={"dataset": str(tmp_path / "saved")})
    assert task.class_names == ["neg", "pos"] and (len(task.train_labels), len(task.test_labels)) == (20, 20)


@pytest.mark.parametrize("case, expected", [
    ("missing_column", r"reviews.csv: no column 'text' \(columns: review, stars\); name it with own_tasks.t.text"),
    ("one_class", r"reviews.csv: column 'stars' holds one class \('good'\)"),
    ("empty_text", r"reviews.csv: row 3, column 'review': expected text"),
    ("fractional_labels", r"reviews.csv: row 2, column 'stars': labels must be class names or integers, got 0.5"),
    ("unreadable_image", r"broken.png: not a readable image"),
    ("one_class_folder", r"1 class folder\(s\) \(blue\); a task needs two or more"),
    ("stray_file", r"notes.txt: not an image file"),
    ("unseen_test_label", r"test.csv: row 1, column 'stars': label 'meh' is not one of the classes"),
])
def test_bad_data_is_refused_naming_the_file_and_column(tmp_path, case, expected):
    frame = sentences(5)
    entry = {"table": str(tmp_path / "reviews.csv"), "text": "review", "label": "stars"}
    if case == "missing_column":
        entry.pop("text")
    elif case == "one_class":
        frame["stars"] = "good"
    elif case == "empty_text":
        frame.loc[2, "review"] = " "
    elif case == "fractional_labels":
        frame["stars"] = [0.5 * (i % 3) for i in range(len(frame))]
    elif case == "unseen_test_label":
        pd.DataFrame({"review": ["fine"], "stars": ["meh"]}).to_csv(tmp_path / "test.csv", index=False)
        entry["test"] = str(tmp_path / "test.csv")
    frame.to_csv(tmp_path / "reviews.csv", index=False)
    if case in ("unreadable_image", "one_class_folder", "stray_file"):
        folder = write_image_folder(tmp_path / "images", classes=("blue",) if case == "one_class_folder"
                                    else ("blue", "red"), per_class=3)
        if case == "unreadable_image":
            (folder / "red" / "broken.png").write_bytes(b"not a png")
        if case == "stray_file":
            (folder / "red" / "notes.txt").write_text("x")
        entry = {"images": str(folder)}
    with pytest.raises(ValueError, match=expected):
        load_task(f"t_{case}" if case != "missing_column" else "t", own=entry, image_size=8)


def config_with(own_tasks, tasks):
    config = json.loads(json.dumps(TINY))
    config["own_tasks"] = own_tasks
    config["backbones"]["effnet"]["tasks"] = tasks
    return config


@pytest.mark.parametrize("own, tasks, message", [
    ({"scans": {"images": "nowhere"}}, ["scans", "digits"], "own_tasks.scans.images: nowhere is not a folder"),
    ({"scans": {"images": ".", "label": "x"}}, ["scans", "digits"], "own_tasks.scans.label: not a field of an image"),
    ({"scans": {"images": ".", "metric": "auc"}}, ["scans", "digits"], "own_tasks.scans.metric: 'auc' is not"),
    ({"scans": {"table": "x.xlsx"}}, ["scans", "digits"], r"x.xlsx is not a table dpmerge reads"),
    ({"digits": {"images": "."}}, ["digits", "textures"], "'digits' is a task dpmerge already has"),
    ({"notes": {"table": "pyproject.toml"}}, ["notes", "digits"], "is not a table"),
    ({"My-Scans": {"images": "."}}, ["digits", "textures"], "own_tasks: 'My-Scans' does not match"),
])
def test_the_config_check_refuses_a_bad_declaration_before_any_job(own, tasks, message):
    with pytest.raises(ConfigError, match=message):
        check_config(config_with(own, tasks))


@pytest.mark.slow
@pytest.mark.parametrize("case, message", [
    ("no_label_column", r"own_tasks.reviews.table: .*r.csv has no column 'label' \(its columns: review, stars\); name"),
    ("one_class", r"own_tasks.reviews.table: .*r.csv holds 1 distinct label\(s\) in column 'stars'; a "
                  "classification task needs two or more"),
    ("jsonl_no_text", r"own_tasks.reviews.table: .*r.jsonl has no column 'review'"),
    ("one_class_folder", r"own_tasks.reviews.images: .*images has 1 class subfolder\(s\) \(blue\); a task needs"),
])
def test_the_config_check_reads_a_tables_columns_and_an_image_folders_classes(tmp_path, case, message):
    """Own-task data problems stop the study before its first job, not inside `prepare`."""
    frame = sentences(5)
    entry, backbone_tasks = {"table": str(tmp_path / "r.csv"), "text": "review", "label": "stars"}, "minilm"
    if case == "no_label_column":
        entry.pop("label")
    elif case == "one_class":
        frame["stars"] = "good"
    elif case == "jsonl_no_text":
        frame.rename(columns={"review": "body"}).to_json(tmp_path / "r.jsonl", orient="records", lines=True)
        entry["table"] = str(tmp_path / "r.jsonl")
    elif case == "one_class_folder":
        entry, backbone_tasks = {"images": str(write_image_folder(tmp_path / "images", classes=("blue",),
                                                                  per_class=2))}, "effnet"
    frame.to_csv(tmp_path / "r.csv", index=False)
    config = json.loads(json.dumps(TINY))
    config["own_tasks"] = {"reviews": entry}
    config["backbones"][backbone_tasks]["tasks"] = ["reviews", config["backbones"][backbone_tasks]["tasks"][0]]
    with pytest.raises(ConfigError, match=message):
        check_config(config)


def test_a_text_task_on_an_image_backbone_is_refused(tmp_path):
    sentences(5).to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(ConfigError, match="own task 'reviews' is a text task, but 'efficientnet_lite0' is a vision"):
        check_config(config_with({"reviews": {"table": str(tmp_path / "r.csv")}}, ["reviews", "digits"]))


def test_a_study_of_own_tasks_on_own_backbones_runs_to_the_answer_page_and_the_ledger(tmp_path):
    """The researcher's whole path: an image folder and a CSV of sentences, a tiny timm model and a tiny
    transformers encoder saved in their libraries' formats, a config naming them, Snakemake to the answer."""
    write_image_folder(tmp_path / "data" / "colours", classes=("blue", "green", "red"), per_class=16)
    sentences(30).to_csv(tmp_path / "data" / "reviews.csv", index=False)
    write_tiny_resnet(tmp_path / "models" / "resnet.safetensors")
    write_tiny_bert(tmp_path / "models" / "bert")
    config = {
        "results": "results", "seeds": [0], "epsilons": [4], "methods": ["naive_dp", "dp_merging"],
        "own_tasks": {"colours": {"images": "data/colours"},
                      "reviews": {"table": "data/reviews.csv", "text": "review", "label": "stars", "metric": "f1"}},
        "backbones": {
            "resnet": {"kind": "timm", "model": "test_resnet", "checkpoint": "models/resnet.safetensors",
                       "trainable_blocks": 1, "image_size": 32, "tasks": ["colours", "digits"]},
            "bert": {"kind": "hf_encoder", "checkpoint": "models/bert", "trainable_blocks": 1, "max_length": 16,
                     "tasks": ["reviews", "bbc_topic"]},
        },
        "data": {"max_train": 48, "max_test": 24},
        "finetune": {"epochs": 0.4, "batch_size": 8, "lr": 0.001},
        "merge": {"weight_averaging": {}, "task_arithmetic": {}, "ties": {}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    install_test_key(tmp_path / "results")
    run = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "2", "results/answer.md",
                          "results/privacy/ledger_check.json"],
                         capture_output=True, text=True, env=snakemake_env())
    assert run.returncode == 0, run.stderr[-3000:]
    check = json.loads((tmp_path / "results" / "privacy" / "ledger_check.json").read_text())
    assert check["verdict"] == "PASS", check
    answer = (tmp_path / "results" / "answer.md").read_text()
    assert "resnet" in answer and "bert" in answer
    ledger = pd.read_parquet(tmp_path / "results" / "privacy" / "ledger.parquet")
    own = ledger[ledger["task"].isin(["colours", "reviews"]) & (ledger["method"] != "nonprivate")]
    # N and delta = 1/N follow from the data the task holds, not from the config
    assert sorted(own["task"].unique()) == ["colours", "reviews"]
    for task, rows in own.groupby("task"):
        assert (rows["delta"] == 1 / rows["num_train_examples"]).all(), rows
    assert set(own.loc[own["task"] == "colours", "num_train_examples"]) == {39}  # 48 - round(0.2 * 16) per class
