"""A fine-tuning process killed with SIGKILL resumes from its checkpoint and releases exactly what an
uninterrupted run releases: same task vector, same privacy record (nothing spent twice)."""

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import torch

from dpmerge.privacy_ledger import build_ledger
from dpmerge.taskvectors import load_tensors

SPEC = '{"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32}'


def dpmerge(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "dpmerge.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def finetune_args(folder, name, checkpoint=None):
    args = ["finetune", "--backbone", "effnet", "--backbone-spec", SPEC, "--data", str(folder / "digits.pt"),
            "--method", "dp_merging", "--epsilon", "4", "--seed", "1",
            "--hparams", '{"epochs": 2.0, "batch_size": 8, "lr": 0.005, "log_every": 1}',
            "--out-vector", str(folder / f"{name}.tv.safetensors"), "--out-head", str(folder / f"{name}.head.safetensors")]
    return args + (["--checkpoint", str(checkpoint), "--checkpoint-every", "3"] if checkpoint else [])


def test_sigkilled_finetune_resumes_to_the_uninterrupted_result(tmp_path):
    prepare = dpmerge("prepare", "--backbone", "effnet", "--backbone-spec", SPEC, "--task", "digits",
                      "--max-train", "256", "--max-test", "16", "--out", str(tmp_path / "digits.pt"))
    assert prepare.wait() == 0, prepare.stdout.read()

    reference = dpmerge(*finetune_args(tmp_path, "reference"))
    checkpoint = tmp_path / "ckpt" / "run.pt"
    victim = dpmerge(*finetune_args(tmp_path, "resumed", checkpoint))
    deadline = time.time() + 300
    while not checkpoint.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    assert reference.wait() == 0, reference.stdout.read()
    assert checkpoint.exists() and not (tmp_path / "resumed.tv.safetensors").exists()

    resumed = dpmerge(*finetune_args(tmp_path, "resumed", checkpoint))
    log = resumed.stdout.read()
    assert resumed.wait() == 0, log
    assert "resumed from" in log and "at step 0/" not in log
    assert not checkpoint.exists()  # removed once the outputs are released

    for artifact in ("tv", "head"):
        expected, expected_meta = load_tensors(tmp_path / f"reference.{artifact}.safetensors")
        actual, actual_meta = load_tensors(tmp_path / f"resumed.{artifact}.safetensors")
        assert actual_meta == expected_meta
        for key in expected:
            assert torch.equal(actual[key], expected[key]), key
    # and so the privacy ledger rows agree (the file path aside): nothing was spent twice or lost
    ledgers = [build_ledger([str(tmp_path / f"{name}.tv.safetensors")]).drop(columns=["path"], errors="ignore")
               for name in ("reference", "resumed")]
    pd.testing.assert_frame_equal(ledgers[0], ledgers[1])
