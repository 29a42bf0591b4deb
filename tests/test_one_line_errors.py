"""Bad input to a command is one line naming the file and what was expected, never a traceback, and never a
silently wrong output: the cases a user met (an empty, text or safetensors file given as prepared data, a folder
given as score files, a head given to drift, a full disk)."""

import errno
import json
import subprocess
import sys

import pytest
import torch

from dpmerge.artifacts import atomic_write, save_released, save_tensors, tensors_sha256

RECORD = {"method": "naive_dp", "target_epsilon": 4.0, "spent_epsilon": 3.99, "delta": 0.01, "noise_multiplier": 1.0,
          "effective_noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "clip_norm": 1.0,
          "queries_per_step": 1, "steps_by_queries": {"1": 10}, "accountant": "pld", "sampling": "poisson",
          "neighbouring": "replace_one", "randomness": "keyed", "seed": 0, "rho": 0.0, "anchor_lambda": 0.0,
          "pretrained_sha256": "ab" * 32, "num_train_examples": 100}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dpmerge.cli", *map(str, args)], capture_output=True, text=True)


def one_line_error(result, *fragments):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"", b"task,label\nhello,1\n", "safetensors"])
def test_prepared_data_that_is_not_a_prepared_task_is_named(tmp_path, content):
    data = tmp_path / "task.pt"
    if content == "safetensors":
        save_tensors(data, {"x": torch.zeros(2)})
    else:
        data.write_bytes(content)
    key = tmp_path / "private/study.key"
    result = run_cli("finetune", "--backbone", "effnet", "--backbone-spec", json.dumps({"kind": "efficientnet_lite0"}),
                     "--data", data, "--method", "naive_dp", "--epsilon", "4", "--study-key", key,
                     "--out-vector", tmp_path / "v.safetensors", "--out-head", tmp_path / "h.safetensors")
    one_line_error(result, f"{data}: not a prepared task file written by 'dpmerge prepare'")
    assert not (tmp_path / "v.safetensors").exists()


@pytest.mark.slow
def test_a_folder_given_as_score_files_is_refused_not_read_as_a_dataset(tmp_path):
    (tmp_path / "scores").mkdir()
    result = run_cli("table", tmp_path / "scores", "--kind", "multitask", "--out-prefix", tmp_path / "t")
    one_line_error(result, f"{tmp_path / 'scores'} is a folder; give the .parquet files themselves")
    assert not list(tmp_path.glob("t.*"))


@pytest.mark.slow
def test_drift_refuses_a_head(tmp_path):
    w0 = {"w": torch.ones(3)}
    save_tensors(tmp_path / "w0.safetensors", w0, {"w0_sha256": tensors_sha256(w0)})
    save_released(tmp_path / "head.safetensors", {"w": torch.zeros(3)}, RECORD,
                  {"backbone": "toy", "task": "digits", "artifact": "head"})
    result = run_cli("drift", "--base", tmp_path / "w0.safetensors", "--task-vectors", tmp_path / "head.safetensors",
                     "--out", tmp_path / "drift.parquet")
    one_line_error(result, "head.safetensors is a head, not a task vector")
    assert not (tmp_path / "drift.parquet").exists()


def test_a_full_disk_names_the_folder_and_keeps_what_was_there(tmp_path):
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"earlier result")

    def fill_the_disk(tmp):
        with open(tmp, "wb") as handle:
            handle.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(ValueError, match=rf"{target}: no space left on the device that holds {tmp_path} \(.* free "
                                         r"after this file's 1000 B were removed"):
        atomic_write(target, fill_the_disk)
    assert target.read_bytes() == b"earlier result" and sorted(tmp_path.iterdir()) == [target]


@pytest.mark.slow
def test_the_ledger_of_post_processed_releases_alone_fails_saying_their_releases_are_missing(tmp_path):
    from dpmerge.artifacts import POST_PROCESSING

    parent = "ab" * 32
    save_tensors(tmp_path / "denoised.safetensors", {"w": torch.zeros(3)},
                 {**RECORD, "backbone": "toy", "task": "digits", "artifact": "task_vector",
                  POST_PROCESSING: {"operation": "denoise", "method": "svd", "tensors_sha256": parent}})
    result = run_cli("ledger", tmp_path / "denoised.safetensors", "-o", tmp_path / "l.parquet", "--report",
                     tmp_path / "l.md")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith("error: privacy ledger check failed")
    assert "a post-processing (denoise) of a release the ledger does not hold" in result.stderr
