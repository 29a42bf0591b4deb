"""The Python API (dpmerge/api.py) as a notebook uses it: docs/python-api.md's example runs as written, its
release passes the ledger, and each call refuses what would be silently wrong."""

import re

import pytest
import torch
from torch import nn

from dpmerge.api import evaluate, merge, merged_budget, private_finetune
from dpmerge.artifacts import load_tensors, read_metadata, tensors_sha256
from dpmerge.cli import main
from dpmerge.privacy.release_log import read_entries
from workflow_runs import ROOT


def the_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "python-api.md").read_text(), re.M | re.S)
    assert len(blocks) == 1, "docs/python-api.md has one Python example"
    return blocks[0]


@pytest.mark.slow
def test_the_documented_example_runs_and_its_release_passes_the_ledger(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(the_example(), "docs/python-api.md", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    scores = re.findall(r"(\w+): epsilon ([\d.]+), alone ([\d.]+), merged ([\d.]+)", printed)
    assert [name for name, *_ in scores] == ["parity", "magnitude"], printed
    for name, epsilon, alone, merged in scores:
        assert float(epsilon) <= 4.0
        assert float(alone) > 60 and float(merged) > 50, printed  # both binary tasks learned, far above chance
    assert (tmp_path / "study.key").stat().st_mode & 0o077 == 0
    main(["ledger", "parity.safetensors", "-o", "ledger.parquet", "--report", "ledger.md",
          "--check-out", "check.json"])
    assert '"verdict": "PASS"' in (tmp_path / "check.json").read_text()


@pytest.fixture
def task():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(120, 5, generator=generator)
    labels = (features[:, 0] > 0).long()
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh()), features, labels


@pytest.mark.slow
def test_a_release_is_accounted_from_what_ran_and_the_encoder_returns_to_w0(task, tmp_path):
    encoder, features, labels = task
    w0 = {key: value.clone() for key, value in encoder.state_dict().items()}
    release = private_finetune(encoder, features, labels, task="sign", epsilon=2.0, study_key=tmp_path / "key",
                               epochs=2, batch_size=30, clip_norm=0.5, lr=0.05, log=None)
    record = release.record
    assert record["queries_per_step"] == 2 and record["sampling"] == "poisson"
    assert record["sample_rate"] == pytest.approx(30 / 120) and record["num_train_examples"] == 120
    assert record["spent_epsilon"] <= 2.0 and record["delta"] == pytest.approx(1 / 120)
    assert set(release.task_vector) == {"0.weight", "0.bias"} and release.head["weight"].shape == (2, 8)
    assert any(value.abs().sum() > 0 for value in release.task_vector.values())
    for key, value in encoder.state_dict().items():
        assert torch.equal(value, w0[key]), key
    again = private_finetune(encoder, features, labels, task="sign", epsilon=2.0, study_key=tmp_path / "key",
                             epochs=2, batch_size=30, clip_norm=0.5, lr=0.05, log=None)
    other = private_finetune(encoder, features, labels, task="other", epsilon=2.0, study_key=tmp_path / "key",
                             epochs=2, batch_size=30, clip_norm=0.5, lr=0.05, log=None)
    assert torch.equal(again.task_vector["0.weight"], release.task_vector["0.weight"])  # keyed: reproducible
    assert not torch.equal(other.task_vector["0.weight"], release.task_vector["0.weight"])  # other task: fresh draws


@pytest.mark.slow
def test_a_saved_release_is_logged_beside_its_key_and_another_run_at_its_path_is_refused(task, tmp_path):
    encoder, features, labels = task

    def run(name):
        return private_finetune(encoder, features, labels, task=name, epsilon=2.0, study_key=tmp_path / "key",
                                epochs=1, batch_size=30, lr=0.05, log=None)

    first, again, other = run("sign"), run("sign"), run("other")
    paths = (tmp_path / "sign.safetensors", tmp_path / "sign_head.safetensors")
    first.save(*paths)
    again.save(*paths)  # the same run (same key and identity): the same release, logged again
    entries = read_entries(tmp_path / "releases.jsonl")
    assert len(entries) == 2 and entries[0]["mechanism"] == entries[1]["mechanism"]
    assert {f["artifact"]: f["tensors_sha256"] for f in entries[0]["files"]}["task_vector"] == \
        tensors_sha256(first.task_vector)
    with pytest.raises(ValueError, match=r"was released before by another run.*save\(\.\.\., replace=True\)"):
        other.save(*paths)
    assert load_tensors(paths[0])[0]["0.weight"].equal(first.task_vector["0.weight"])  # nothing overwritten
    other.save(*paths, replace=True)
    assert len(read_entries(tmp_path / "releases.jsonl")) == 3  # the first release stays in the log
    assert "mechanism" not in read_metadata(paths[0]) and "release_log" not in repr(other)


@pytest.mark.slow
def test_merge_and_evaluate_match_the_operator_and_w0_plus_tau(task, tmp_path):
    encoder, features, labels = task
    releases = [private_finetune(encoder, features[rows], labels[rows], task=name, epsilon=2.0,
                                 study_key=tmp_path / "key", epochs=1, batch_size=20, lr=0.05, log=None)
                for name, rows in (("a", slice(0, 60)), ("b", slice(60, 120)))]
    merged = merge(releases, operator="task_arithmetic", scaling=0.5)
    for key in merged:
        torch.testing.assert_close(merged[key], 0.5 * (releases[0].task_vector[key] + releases[1].task_vector[key]))
    assert merged_budget(releases)[0] == max(r.record["spent_epsilon"] for r in releases)
    head = releases[0].head
    with torch.no_grad():
        moved = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        moved.load_state_dict({key: encoder.state_dict()[key] + merged[key] for key in merged})
        logits = moved(features) @ head["weight"].T + head["bias"]
    expected = 100.0 * float((logits.argmax(1) == labels).float().mean())
    assert evaluate(encoder, merged, head, features, labels)["score"] == pytest.approx(expected)


@pytest.mark.parametrize("case, expected", [
    ("batch_norm", "BatchNorm1d: batch statistics mix examples"),
    ("unknown_setting", "unknown setting\\(s\\) learning_rate"),
    ("labels", "labels must be one value per example \\(120\\)"),
    ("frozen", "no parameter that requires grad"),
    ("no_epsilon", "needs a target epsilon"),
])
def test_what_would_be_silently_wrong_is_refused(task, tmp_path, case, expected):
    encoder, features, labels = task
    arguments = {"task": "t", "epsilon": 1.0, "study_key": tmp_path / "key", "log": None}
    if case == "batch_norm":
        encoder = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8))
    elif case == "unknown_setting":
        arguments["learning_rate"] = 0.1
    elif case == "labels":
        labels = labels[:10]
    elif case == "frozen":
        encoder.requires_grad_(False)
    elif case == "no_epsilon":
        arguments["epsilon"] = None
    with pytest.raises(ValueError, match=expected):
        private_finetune(encoder, features, labels, **arguments)
