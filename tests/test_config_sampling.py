"""The batch size and delta are held against each task's N before any job (dpmerge/config_sampling.py), and a task's
own batch size reaches its fine-tunes only."""

import json

import pytest
import yaml

from dpmerge.config_check import ConfigError, check_config
from dpmerge.config_fields import finetune_settings
from dpmerge.config_sampling import check_limits, sampling_limits, training_size
from dpmerge.data.loading import _full_split, load_task
from dpmerge.data.own import check_data
from dpmerge.data.registry import EMBEDDED_TASKS, PAPER_TASKS, TASKS
from test_pipeline import TINY, planned_jobs, snakemake


@pytest.mark.parametrize("name", EMBEDDED_TASKS)
def test_the_registry_knows_each_embedded_tasks_training_size(name):
    assert TASKS[name].train_size == len(_full_split(name).train_labels)


def test_data_directory_tasks_are_counted_when_read():
    assert all(TASKS[name].train_size is None for name in PAPER_TASKS)


@pytest.mark.parametrize("data", [{"max_train": 100}, {"max_train": 100, "validation_fraction": 0.25},
                                  {"max_train": None, "validation_fraction": 0.2}, {"max_train": 5000}])
def test_the_checks_n_is_the_n_the_loader_trains_on(data):
    config = {"data": data}
    loaded = load_task("textures", image_size=4, max_train=data["max_train"],
                       validation_fraction=data.get("validation_fraction"))
    size = training_size(config, "textures", {})
    assert size.exact and size.upper == len(loaded.train_labels)


def test_own_tasks_are_counted_exactly_with_their_own_test_split_and_bounded_without(tmp_path):
    rows = "text,label\n" + "".join(f"w{i} x,{'ab'[i % 2]}\n" for i in range(30))
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "test.csv").write_text(rows[:40])
    exact = check_data("mine", {"table": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")})
    bounded = check_data("mine", {"table": str(tmp_path / "train.csv")})
    assert (exact.upper, exact.exact) == (30, True) and (bounded.upper, bounded.exact) == (30, False)
    assert check_data("mine", {"table": str(tmp_path / "t.parquet")}) is None  # read by prepare


def _config():
    return yaml.safe_load(yaml.safe_dump(TINY))


def test_a_bounded_own_task_refuses_only_a_batch_above_its_bound(tmp_path):
    (tmp_path / "mine.csv").write_text("text,label\n" + "".join(f"w{i} x,{'ab'[i % 2]}\n" for i in range(30)))
    config = _config()
    config["own_tasks"] = {"mine": {"table": str(tmp_path / "mine.csv")}}
    config["backbones"]["minilm"]["tasks"] = ["bbc_topic", "mine"]
    # 30 rows, 24 of them trained on after the 0.2 hold-out: a batch of 30 is refused by the job, not here
    config["backbones"]["minilm"]["finetune"] = {"batch_size": 30}
    check_config(config)
    config = _config()
    config["own_tasks"] = {"mine": {"table": str(tmp_path / "mine.csv")}}
    config["backbones"]["minilm"]["tasks"] = ["bbc_topic", "mine"]
    config["backbones"]["minilm"]["finetune"] = {"batch_size": 31}
    with pytest.raises(ConfigError, match=r"backbones\.minilm\.finetune\.batch_size: 31 exceeds task 'mine''s "
                                          r"training examples \(at most 30\)"):
        check_config(config)


def test_a_delta_at_one_over_n_typed_as_a_decimal_passes_and_public_n_sets_the_bound():
    config = _config()
    config["finetune"]["delta"] = 0.0208333333333  # 1/48
    check_config(config)
    config = _config()
    config["finetune"]["delta"] = 0.01
    config["privacy"] = {"neighbouring": "add_remove", "public_n": 200}
    with pytest.raises(ConfigError, match=r"finetune\.delta: 0\.01 exceeds 1/public_n = 0\.005"):
        check_config(config)


def test_the_noise_studys_batch_sizes_are_held_against_n():
    config = _config()
    config["noise_scale"] = {"methods": ["naive_dp"], "operator": "weight_averaging", "batch_sizes": [8, 64]}
    with pytest.raises(ConfigError, match=r"noise_scale\.batch_sizes: 64 exceeds task 'digits''s 48 training"):
        check_config(config)


def test_a_tasks_own_batch_size_overrides_every_method_on_that_task_only():
    config = _config()
    config["backbones"]["effnet"]["finetune"]["by_task"] = {"textures": {"batch_size": 4}}
    check_config(config)
    for method in ("naive_dp", "dp_merging", "nonprivate"):
        assert finetune_settings(config, "effnet", method, "textures")["batch_size"] == 4
        assert finetune_settings(config, "effnet", method, "digits")["batch_size"] == 8
        assert "by_task" not in finetune_settings(config, "effnet", method)


def test_a_tasks_own_batch_size_reaches_its_fine_tunes_and_leaves_the_others_unchanged(tmp_path):
    """A dry run's finetune commands: the task with its own batch size gets it; every other job's settings are
    those of a study without the field (so adding it reruns nothing else)."""

    def commands(config):
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        result = snakemake(tmp_path, "-n", "-p", "--forceall")
        assert result.returncode == 0, result.stderr[-2000:]
        jobs = {}
        for line in (result.stdout + result.stderr).splitlines():
            if "dpmerge finetune " in line:
                hparams = json.loads(line.split("--hparams '")[1].split("'")[0])
                vector = line.split("--out-vector ")[1].split()[0]
                jobs[vector] = hparams
        return jobs, planned_jobs(result.stdout + result.stderr)

    before, planned_before = commands(_config())
    config = _config()
    config["backbones"]["effnet"]["finetune"]["by_task"] = {"textures": {"batch_size": 4}}
    after, planned_after = commands(config)
    assert planned_before == planned_after, (planned_before, planned_after)
    assert set(before) == set(after) and before
    for vector, hparams in after.items():
        if "/effnet/" in vector and vector.endswith("/textures.safetensors"):
            assert hparams["batch_size"] == 4 and {**hparams, "batch_size": 8} == before[vector]
        else:
            assert hparams == before[vector], vector



def _parquet_task(tmp_path, rows=10):
    import pandas as pd

    pd.DataFrame({"text": [f"words number {i}" for i in range(rows)], "label": ["ab"[i % 2] for i in range(rows)]}
                 ).to_parquet(tmp_path / "mine.parquet")
    pd.DataFrame({"text": ["a b", "c d"], "label": ["a", "b"]}).to_parquet(tmp_path / "mine_test.parquet")
    return {"table": str(tmp_path / "mine.parquet"), "test": str(tmp_path / "mine_test.parquet")}


def test_prepare_refuses_what_only_reading_the_data_shows_before_any_fine_tune(tmp_path):
    """An own Parquet table is counted when read: the check passes it, the workflow's prepare refuses the batch
    size (naming the field and the fix) and no fine-tune of the task starts."""
    config = _config()
    config["own_tasks"] = {"mine": _parquet_task(tmp_path, rows=6)}
    config["backbones"] = {"minilm": {**config["backbones"]["minilm"], "tasks": ["mine"]}}
    config["backbones"]["minilm"].pop("public_data")
    config["merge"] = {"weight_averaging": {}, "task_arithmetic": {}, "ties": {}}
    config["sweeps"] = {}
    config["diagnostics"] = {}
    check_config(yaml.safe_load(yaml.safe_dump(config)))  # N unknown here
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path)
    assert result.returncode != 0
    log = (tmp_path / "results/logs/prepare/minilm/mine.log").read_text()
    assert "finetune.batch_size: 8 exceeds task 'mine''s 6 training examples (as read by prepare)" in log, log
    assert not list((tmp_path / "results").glob("logs/finetune/**/*.log"))
    assert not list((tmp_path / "results").glob("taskvectors/**/*.safetensors"))
    # the same limits from the stage itself, and a delta above 1/N
    limits = sampling_limits(check_and_return(config), "minilm", "mine")
    assert list(limits["batch_size"]) == [8, "finetune.batch_size"]
    assert sampling_limits(check_and_return(_config()), "effnet", "lfw") == {}  # public data: nothing trains on it
    check_limits({}, 1)
    with pytest.raises(ConfigError, match=r"finetune\.batch_size: 8 exceeds task 'mine''s 6 training examples "
                                          r"\(as read by prepare\); give at most 6, or that task its own batch "
                                          r"size: backbones\.minilm\.finetune\.by_task\.mine\.batch_size"):
        check_limits(limits, 6)
    config["finetune"]["delta"] = 0.05
    with pytest.raises(ConfigError, match=r"finetune\.delta: 0\.05 exceeds 1/N = 0\.0333333 for task 'mine'"):
        check_limits(sampling_limits(check_and_return(config), "minilm", "mine"), 30)


def check_and_return(config):
    config = yaml.safe_load(yaml.safe_dump(config))
    check_config(config)
    return config
