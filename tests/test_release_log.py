"""A release is forever (privacy/release_log.py, privacy/ledger_log.py): every release is logged before it is
published, a rerun that would replace one is refused unless allowed and the ledger then composes both, and a file
whose bytes changed after release is refused by every reader and failed by the ledger, naming it."""

import json
import os
import shutil
import subprocess

import pandas as pd
import pytest
import yaml

from conftest import install_test_key
from dpmerge.artifacts import SafetensorsFileError, load_tensors, read_metadata, save_tensors, tensors_sha256
from dpmerge.privacy.release_log import (
    ReleaseLogError,
    append,
    check_replacement,
    publish,
    publish_tensors,
    read_entries,
    release_log_path,
)
from workflow_runs import SNAKEMAKE, snakemake_env

# the only merge is weight averaging: every diagnostic names it (none runs: seeds 0)
ONLY_WA = {"seeds": 0, **{d: {"operator": "weight_averaging"} for d in ("interpolation", "curvature", "landscape")}}

RECORD = {"method": "naive_dp", "target_epsilon": 4.0, "spent_epsilon": 3.99, "delta": 0.01, "noise_multiplier": 1.0,
          "effective_noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "clip_norm": 1.0,
          "queries_per_step": 1, "steps_by_queries": {"1": 10}, "accountant": "pld", "sampling": "poisson",
          "neighbouring": "replace_one", "randomness": "keyed", "seed": 0, "rho": 0.0, "anchor_lambda": 0.0,
          "pretrained_sha256": "ab" * 32, "num_train_examples": 100}


@pytest.fixture
def study(tmp_path):
    key = tmp_path / "results" / "private" / "study.key"
    key.parent.mkdir(parents=True, mode=0o700)
    return release_log_path(key), tmp_path / "results"


def release(log, results, mechanism, value, name="digits"):
    tensors = {"w": torch_full(value)}
    publish(log, mechanism=mechanism, record=RECORD, where={"backbone": "effnet", "task": name},
            files=[(results / f"taskvectors/{name}.safetensors", tensors, "task_vector")])
    return tensors


def torch_full(value):
    import torch

    return torch.full((3,), float(value))


def test_a_release_is_logged_with_its_hash_before_it_is_published_and_carries_it(study):
    log, results = study
    tensors = release(log, results, "m1", 1.0)
    (entry,) = read_entries(log)
    assert entry["mechanism"] == "m1" and entry["metadata"]["task"] == "digits"
    assert entry["files"] == [{"path": "taskvectors/digits.safetensors", "artifact": "task_vector",
                               "tensors_sha256": tensors_sha256(tensors)}]
    assert read_metadata(results / "taskvectors/digits.safetensors")["tensors_sha256"] == tensors_sha256(tensors)
    assert oct(log.stat().st_mode & 0o777) == oct(0o600)


def test_another_mechanism_at_a_logged_path_is_refused_unless_allowed_and_the_same_one_is_not(study):
    log, results = study
    release(log, results, "m1", 1.0)
    paths = [results / "taskvectors/digits.safetensors"]
    check_replacement(log, paths, "m1", allowed=False)  # the same run again: the same release
    with pytest.raises(ReleaseLogError, match=r"taskvectors/digits.safetensors was released before by another run "
                                              r"\(method naive_dp, target_epsilon 4.0, seed 0.*replace_releases: true"):
        check_replacement(log, paths, "m2", allowed=False)
    check_replacement(log, paths, "m2", allowed=True)
    check_replacement(log, [results / "taskvectors/other.safetensors"], "m2", allowed=False)


def test_a_log_line_that_is_not_an_entry_is_refused_naming_the_line(study):
    log, results = study
    append(log, mechanism="m1", files=[], metadata={})
    with open(log, "a") as handle:
        handle.write('{"cut": \n')
    with pytest.raises(ReleaseLogError, match=r"releases.jsonl, line 2: not a release-log entry"):
        read_entries(log)


def test_a_release_whose_bytes_changed_is_refused_by_every_reader_naming_it(tmp_path):
    path = tmp_path / "v.safetensors"
    save_tensors(path, {"w": torch_full(1.0)}, {**RECORD, "tensors_sha256": ""})
    load_tensors(path)
    flip_last_byte(path)
    with pytest.raises(SafetensorsFileError, match=r"v.safetensors: its tensors do not match the SHA-256 its record"):
        load_tensors(path)


def test_a_private_statistic_is_logged_with_its_hash_and_a_merge_refuses_it_once_a_byte_changed(study):
    from dpmerge.stages.merge import statistics_source_of

    log, results = study
    path = results / "statistics/fisher.safetensors"
    meta = {"artifact": "merge_statistics", "kind": "fisher", "source": "private", "tasks": ["digits"],
            "records": [{"task": "digits", "task_vector_sha256": "v" * 64}]}
    publish_tensors(log, mechanism="statistic", path=path, tensors={"0/w": torch_full(1.0)}, metadata=meta,
                    artifact="merge_statistics", settings={"statistic": {"epsilon": 1.0}})
    (entry,) = read_entries(log)
    assert entry["files"] == [{"path": "statistics/fisher.safetensors", "artifact": "merge_statistics",
                               "tensors_sha256": read_metadata(path)["tensors_sha256"]}]
    assert entry["settings"] == {"statistic": {"epsilon": 1.0}} and entry["metadata"]["records"] == meta["records"]
    inputs = [{"path": "digits.safetensors", "sha256": "v" * 64}]
    statistics_source_of(str(path), "fisher", [{"task": "digits"}], inputs)
    flip_last_byte(path)
    with pytest.raises(SafetensorsFileError, match="fisher.safetensors: its tensors do not match the SHA-256"):
        statistics_source_of(str(path), "fisher", [{"task": "digits"}], inputs)


def test_a_streamed_file_carries_its_own_hash_in_the_place_the_header_kept_for_it(tmp_path):
    from dpmerge.artifacts import file_tensors_sha256, write_tensors_streaming

    tensors = {"b": torch_full(2.0), "a": torch_full(1.0)}
    layout = {name: (value.dtype, tuple(value.shape)) for name, value in tensors.items()}
    paths = [tmp_path / f"{name}.safetensors" for name in ("first", "second")]
    orders = ({"z": 1, "tensors_sha256": "copied", "a": 2}, {"a": 2, "z": 1, "tensors_sha256": ""})
    for path, metadata in zip(paths, orders):
        write_tensors_streaming(path, layout, iter(tensors.items()), metadata)
    assert paths[0].read_bytes() == paths[1].read_bytes()  # the same bytes whatever the metadata's order
    assert read_metadata(paths[0])["tensors_sha256"] == file_tensors_sha256(paths[0]) == tensors_sha256(tensors)
    flip_last_byte(paths[0])
    with pytest.raises(SafetensorsFileError, match="first.safetensors: its tensors do not match the SHA-256"):
        load_tensors(paths[0])


def test_a_merged_model_carries_its_own_hash_and_a_changed_byte_is_refused_by_its_readers(workdir):
    from dpmerge.artifacts import file_tensors_sha256

    merged = workdir / "results/merged/effnet/eps4/naive_dp/s0/weight_averaging.safetensors"
    assert read_metadata(merged)["tensors_sha256"] == file_tensors_sha256(merged)
    load_tensors(merged)  # how the diagnostics read it
    flip_last_byte(merged)
    with pytest.raises(SafetensorsFileError, match="weight_averaging.safetensors: its tensors do not match"):
        load_tensors(merged)


def flip_last_byte(path, keep_mtime=False):
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# The workflow: one backbone, two tasks, one method, the ledger and one merge's scores
TINY = {"results": "results", "seeds": [0], "epsilons": [4], "methods": ["naive_dp"],
        "backbones": {"effnet": {"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32,
                                 "tasks": ["digits", "textures"], "finetune": {"lr": 0.002}}},
        "data": {"max_train": 48, "max_test": 24}, "finetune": {"epochs": 0.4, "batch_size": 8},
        "merge": {"weight_averaging": {}}, "tables": {"operator": "weight_averaging"}, "diagnostics": ONLY_WA}
TARGETS = ["results/privacy/ledger_check.json",
           "results/scores/merged/effnet/eps4/naive_dp/s0/weight_averaging.parquet"]


def run(workdir, *args, targets=TARGETS):
    # the targets first: --config and --forcerun take every word after them
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--cores", "2", *targets, *args],
                          capture_output=True, text=True, env=snakemake_env())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release_log_study")
    (folder / "config.yaml").write_text(yaml.safe_dump(TINY))
    install_test_key(folder / "results")
    result = run(folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


@pytest.fixture
def workdir(finished, tmp_path):
    """A copy of the finished study for each test (times kept, so Snakemake finds nothing to do in it)."""
    copy = tmp_path / "study"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def check(workdir):
    return json.loads((workdir / "results/privacy/ledger_check.json").read_text())


def test_a_changed_setting_does_not_forget_the_first_releases(workdir):
    # as root too (the tests run as root in CI): write protection is no guard there, the log is
    release_log = workdir / "results/private/releases.jsonl"
    assert len(read_entries(release_log)) == 2 and check(workdir)["verdict"] == "PASS"
    vector = workdir / "results/taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors"
    first = vector.read_bytes()
    for dry in ([], ["-n"]):  # refused before any job, a dry run too
        changed = run(workdir, "--config", "backbones={effnet: {finetune: {lr: 0.003}}}", *dry)
        output = changed.stdout + changed.stderr
        assert changed.returncode != 0
        assert "2 release(s) would be made again where this study already released with other settings" in output
        assert "hparams.lr 0.002 -> 0.003" in output and "privacy: {replace_releases: true}" in output
    # nothing ran, so Snakemake deleted nothing: the first release is on disk as released, and logged once
    assert vector.read_bytes() == first and len(read_entries(release_log)) == 2

    # the stage's own check (the full identity: also what the settings do not show, e.g. edited data)
    from dpmerge.privacy.release_log import check_replacement

    with pytest.raises(ReleaseLogError, match="was released before by another run"):
        check_replacement(release_log, [vector], "another mechanism", allowed=False)

    allowed = run(workdir, "--config", "backbones={effnet: {finetune: {lr: 0.003}}}",
                  "privacy={replace_releases: true}")
    assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
    verdict = check(workdir)
    assert verdict["verdict"] == "PASS" and verdict["releases"] == 4 and verdict["earlier_releases"] == {"replaced": 2}
    ledger = pd.read_parquet(workdir / "results/privacy/ledger.parquet")
    assert sorted(ledger["status"]) == ["current", "current", "replaced", "replaced"]
    report = (workdir / "results/privacy/ledger.md").read_text()
    assert "2 of them the release log holds from earlier runs" in report
    assert "The study's release log holds 4 released runs" in report
    # the composition counts both releases of each task's data
    assert "| digits | effnet | replace_one | 2 |" in report


def test_a_deleted_release_made_again_by_the_same_run_is_one_release(workdir):
    vector = workdir / "results/taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors"
    before = vector.read_bytes()
    vector.unlink()
    again = run(workdir, targets=[*TARGETS, str(vector.relative_to(workdir))])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert vector.read_bytes() == before  # the same key and identity: the same release, byte for byte
    assert check(workdir)["releases"] == 2 and check(workdir)["earlier_releases"] == {}


@pytest.mark.parametrize("keep_mtime", [True, False])
def test_a_flipped_byte_in_a_release_is_caught_naming_the_file(workdir, keep_mtime):
    vector = workdir / "results/taskvectors/effnet/eps4/naive_dp/s0/textures.safetensors"
    flip_last_byte(vector, keep_mtime=keep_mtime)
    if keep_mtime:  # Snakemake sees nothing to do; the ledger, run again, reads every release whole
        result = run(workdir, "--forcerun", "privacy_ledger")
    else:  # everything downstream reruns on the changed file, and every reader refuses it
        result = run(workdir)
    assert result.returncode != 0
    logs = "".join(p.read_text() for p in (workdir / "results/logs").rglob("*.log"))
    assert "textures.safetensors: its tensors do not match the SHA-256 its record carries" in logs
    if keep_mtime:  # the failed ledger's outputs are removed by Snakemake; its log says why
        assert "privacy ledger check failed" in (workdir / "results/logs/privacy_ledger.log").read_text()


def private_fisher(epsilon, *more):
    return ["--config", f"merge={{fisher: {{statistics: {{data: private, examples: 16, clip_norm: 0.01, "
                        f"epsilon: {epsilon}}}}}}}", *more]


def test_a_private_statistic_is_a_release_the_ledger_composes_after_it_is_replaced(workdir):
    """A private merge statistic reads the tasks' training data: logged before it is written, refused where the
    log holds another one at its path, and composed from the log once its file is replaced."""
    release_log = workdir / "results/private/releases.jsonl"
    statistic = workdir / "results/statistics/effnet/eps4/naive_dp/s0/fisher.safetensors"
    first = run(workdir, *private_fisher(1.0), targets=TARGETS[:1])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    entry = read_entries(release_log)[-1]
    assert entry["files"] == [{"path": "statistics/effnet/eps4/naive_dp/s0/fisher.safetensors",
                               "artifact": "merge_statistics",
                               "tensors_sha256": read_metadata(statistic)["tensors_sha256"]}]
    assert [r["statistic_epsilon"] for r in entry["metadata"]["records"]] == [1.0, 1.0]
    assert check(workdir)["statistics"] == 2 and check(workdir)["earlier_statistics"] == {}

    # another budget for the statistic: refused before any job, so Snakemake deletes nothing
    before = statistic.read_bytes()
    refused = run(workdir, *private_fisher(2.0), targets=TARGETS[:1])
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "1 release(s) would be made again" in output
    assert "fisher.safetensors: statistic.epsilon 1.0 -> 2.0" in output and statistic.read_bytes() == before
    # the stage's own check: the full identity (the vectors it reads too), before it reads any data
    from dpmerge.stages.merge import statistics_mechanism

    vectors = [read_metadata(workdir / f"results/taskvectors/effnet/eps4/naive_dp/s0/{t}.safetensors")
               for t in ("digits", "textures")]
    with pytest.raises(ValueError, match="fisher.safetensors was released before by another run"):
        statistics_mechanism(str(workdir / "results/private/study.key"), "fisher", vectors, [r["task_vector_sha256"]
                             for r in entry["metadata"]["records"]], str(statistic), False,
                             {"examples": 16, "clip_norm": 0.01, "epsilon": 2.0})

    allowed = run(workdir, *private_fisher(2.0, "privacy={replace_releases: true}"), targets=TARGETS[:1])
    assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
    verdict = check(workdir)
    assert verdict["verdict"] == "PASS" and verdict["earlier_statistics"] == {"replaced": 2}  # one row per task
    statistics = pd.read_parquet(workdir / "results/privacy/merge_statistics.parquet")
    assert sorted(zip(statistics["statistic_epsilon"], statistics["status"])) == [
        (1.0, "replaced"), (1.0, "replaced"), (2.0, "current"), (2.0, "current")]
    report = (workdir / "results/privacy/ledger.md").read_text()
    assert "| digits | effnet | replace_one | 1 | 2 |" in report  # one fine-tune, both statistics composed
    assert "fisher.safetensors (replaced) | fisher | private |" in report
