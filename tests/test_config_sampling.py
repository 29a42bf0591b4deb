"""The batch size and delta are held against each task's N before any job (dpmerge/config_sampling.py), and a task's
own batch size reaches its fine-tunes only."""

import json
import subprocess
import sys

import pytest
import yaml

from dpmerge.config_check import ConfigError, check_config
from dpmerge.config_fields import finetune_settings
from dpmerge.config_sampling import check_limits, sampling_limits, training_size
from dpmerge.data.loading import _full_split, load_task
from dpmerge.data.own_readers import training_examples
from dpmerge.data.registry import EMBEDDED_TASKS, PAPER_TASKS, TASKS
from workflow_runs import TINY, planned_jobs, snakemake, snakemake_env


@pytest.mark.slow
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
    assert training_size(config, "textures", {}) == len(loaded.train_labels)


def _table(tmp_path, rows=30):
    (tmp_path / "mine.csv").write_text("text,label\n" + "".join(f"w{i} x,{'ab'[i % 2]}\n" for i in range(rows)))
    return {"table": str(tmp_path / "mine.csv")}


def test_an_own_tasks_n_is_what_prepare_reads_with_its_held_out_fraction(tmp_path):
    entry = _table(tmp_path)
    loaded = load_task("mine", image_size=4, own=entry)
    assert training_examples("mine", entry) == len(loaded.train_labels) == 24  # 30 rows, 0.2 of each class out


def _config():
    return yaml.safe_load(yaml.safe_dump(TINY))


@pytest.mark.slow
def test_an_own_tasks_batch_and_delta_are_held_against_its_n_before_any_job(tmp_path):
    config = _config()
    config["own_tasks"] = {"mine": _table(tmp_path)}
    config["backbones"]["minilm"]["tasks"] = ["bbc_topic", "mine"]
    config["backbones"]["minilm"]["finetune"] = {"by_task": {"mine": {"batch_size": 24}}}
    check_config(yaml.safe_load(yaml.safe_dump(config)))
    config["backbones"]["minilm"]["finetune"] = {"by_task": {"mine": {"batch_size": 25}}}
    with pytest.raises(ConfigError, match=r"backbones\.minilm\.finetune\.by_task\.mine\.batch_size: 25 exceeds "
                                          r"task 'mine''s 24 training examples \(after data\.max_train\)"):
        check_config(yaml.safe_load(yaml.safe_dump(config)))
    config["backbones"]["minilm"]["tasks"] = ["mine"]
    config["backbones"]["minilm"]["finetune"] = {"by_method": {"dp_merging": {"delta": 0.05}}}
    with pytest.raises(ConfigError, match=r"backbones\.minilm\.finetune\.by_method\.dp_merging\.delta: 0\.05 "
                                          r"exceeds 1/N = 0\.0416667 for task 'mine'"):
        check_config(yaml.safe_load(yaml.safe_dump(config)))


@pytest.mark.slow
def test_an_unreadable_own_image_is_refused_before_any_job_and_jobs_do_not_read_the_data_again(tmp_path):
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8)).save(tmp_path / "images" / label / f"{i}.png")
    (tmp_path / "images" / "b" / "broken.png").write_bytes(b"not a png")
    config = _config()
    config["own_tasks"] = {"mine": {"images": str(tmp_path / "images")}}
    config["backbones"]["effnet"]["tasks"] = ["digits", "mine"]
    config["finetune"]["batch_size"] = 4
    with pytest.raises(ConfigError, match=r"broken\.png: not a readable image"):
        check_config(yaml.safe_load(yaml.safe_dump(config)))
    check_config(yaml.safe_load(yaml.safe_dump(config)), read_own_data=False)  # a job's parse: the main checked


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



def test_prepare_refuses_what_only_reading_the_data_shows_before_any_fine_tune(tmp_path):
    """The paper's datasets are counted when read: every prepare job is given its task's limits (a dry run's
    commands), and the stage refuses them against the N it reads, naming the field and the fix, before its work."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(_config()))
    result = snakemake(tmp_path, "-n", "-p")
    commands = [line for line in (result.stdout + result.stderr).splitlines() if "dpmerge prepare " in line]
    assert commands and all("--sampling-limits" in line for line in commands)
    digits = next(line for line in commands if "--task digits " in line)
    limits = json.loads(digits.split("--sampling-limits '")[1].split("'")[0])
    assert limits["batch_size"] == [8, "finetune.batch_size"] and limits["task"] == "digits"
    out = tmp_path / "digits.pt"
    refused = subprocess.run(
        [sys.executable, "-m", "dpmerge.cli", "prepare", "--backbone", "effnet", "--backbone-spec",
         json.dumps({"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 8}), "--task", "digits",
         "--max-train", "6", "--max-test", "4", "--sampling-limits", json.dumps(limits), "--out", str(out)],
        capture_output=True, text=True, env=snakemake_env())
    assert refused.returncode != 0 and not out.exists()
    assert "finetune.batch_size: 8 exceeds task 'digits''s 6 training examples (as read by prepare); give at most " \
           "6, or that task its own batch size: backbones.effnet.finetune.by_task.digits.batch_size" in refused.stderr
    assert "Traceback" not in refused.stderr
    # the same limits from the stage itself, and a delta above 1/N
    config = _config()
    config["own_tasks"] = {"mine": _table(tmp_path)}
    config["backbones"]["minilm"]["tasks"] = ["bbc_topic", "mine"]
    limits = sampling_limits(check_and_return(config), "minilm", "mine")
    assert list(limits["batch_size"]) == [8, "finetune.batch_size"]
    assert sampling_limits(check_and_return(_config()), "effnet", "lfw") == {}  # public data: nothing trains on it
    check_limits({}, 1)
    with pytest.raises(ConfigError, match=r"finetune\.batch_size: 8 exceeds task 'mine''s 6 training examples "
                                          r"\(as read by prepare\); give at most 6, or that task its own batch "
                                          r"size: backbones\.minilm\.finetune\.by_task\.mine\.batch_size"):
        check_limits(limits, 6)
    with pytest.raises(ConfigError, match=r"finetune\.delta: 0\.05 exceeds 1/N = 0\.0333333 for task 'mine'"):
        check_limits({**limits, "delta": [0.05, "finetune.delta"]}, 30)
    check_limits({**limits, "delta": [0.05, "finetune.delta"], "delta_bounded_by_n": False}, 30)  # public_n


def check_and_return(config):
    config = yaml.safe_load(yaml.safe_dump(config))
    check_config(config)
    return config
