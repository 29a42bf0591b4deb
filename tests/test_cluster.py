"""Nothing finished is lost, on a workstation and on a real Slurm cluster.

One small config (EfficientNet, two tasks, DP-Merging, two merges, Table 1, the ledger) runs three times:
uninterrupted under profiles/local (the reference); under profiles/local with SIGTERM sent to Snakemake's process
group (Snakemake and the running fine-tunes) in the middle of the fine-tunes, then started again; and through
profiles/slurm on a real single-node Slurm
(tests/slurm_node.py) with one fine-tune's job scancelled mid-way, which the profile's retries resubmit. Both
interrupted runs must resume from the checkpoint and end bit-identical to the reference: the same task vectors,
the same privacy records, the same merges, scores and tables. They start from a copy of the reference's study
key, as a study restored from its backup does (a new key would give other releases, tested in test_pipeline).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

import slurm_node
from dpmerge.artifacts import load_tensors
from workflow_runs import ROOT, SNAKEMAKE, snakemake_env

# Slurm's daemons, installed with apt-get where missing (tests/slurm_node.py): beyond the fast tier (tests/tiers.py)
pytestmark = pytest.mark.system

# 160 DP-Merging steps per task (about 10 s here) with a checkpoint every 2: a kill after the first checkpoint
# lands mid-way
CONFIG = {
    "results": "results",
    "seeds": [0],
    "epsilons": [4],
    "methods": ["dp_merging"],
    "checkpoint_every": 2,
    "backbones": {"effnet": {"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32,
                             "tasks": ["digits", "textures"], "resources": {"mem_mb": 1500, "runtime": "30m"}}},
    "data": {"max_train": 320, "max_test": 24},
    "finetune": {"epochs": 4.0, "batch_size": 8, "lr": 0.002},
    "merge": {"weight_averaging": {}, "ties": {"density": 0.2}},
    # not run here (not among the targets), but each must name a configured merge
    "diagnostics": {name: {"operator": "weight_averaging"} for name in ("interpolation", "curvature", "landscape")},
}
TARGETS = ["results/tables/table1_effnet_eps4.parquet", "results/privacy/ledger.parquet"]
CHECKPOINTS = "results/checkpoints/effnet/eps4/dp_merging/s0"
FINETUNE_LOGS = "results/logs/finetune/effnet/eps4/dp_merging/s0"


def start_snakemake(workdir: Path, *args, targets=TARGETS, env=None) -> subprocess.Popen:
    (workdir / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env = snakemake_env(**(env or {}))
    return subprocess.Popen([*SNAKEMAKE, "--directory", str(workdir), *args, *targets], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 1200) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-5000:]
    return output


def wait_for_checkpoint(workdir: Path, process: subprocess.Popen, timeout: float = 600) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted((workdir / CHECKPOINTS).glob("*.pt"))
        if found:
            return found[0]
        if process.poll() is not None:
            pytest.fail("the run ended before any fine-tune checkpointed:\n" + process.stdout.read()[-5000:])
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"no checkpoint under {CHECKPOINTS} within {timeout} s")


def share_study_key(source: Path, target: Path) -> None:
    """The reference run's study key in `target`'s results folder, kept as private as the original."""
    key = target / "results/private/study.key"
    key.parent.mkdir(parents=True, mode=0o700)
    shutil.copyfile(source / "results/private/study.key", key)
    key.chmod(0o600)


def local_profile():
    return ("--workflow-profile", str(ROOT / "profiles/local"), "--cores", "2")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    finish(start_snakemake(workdir, *local_profile()))
    return workdir


def assert_same_results(actual: Path, expected: Path, released: int, tables: int):
    """The `actual` run's safetensors and Parquet files (`released` and `tables` of them) are identical to the
    reference's: tensors, metadata (the privacy record) and frames."""
    files = {suffix: sorted(p.relative_to(actual) for p in (actual / "results").rglob(f"*{suffix}"))
             for suffix in (".safetensors", ".parquet")}
    assert (len(files[".safetensors"]), len(files[".parquet"])) == (released, tables), files
    for path in files[".safetensors"]:
        want, want_meta = load_tensors(expected / path)
        got, got_meta = load_tensors(actual / path)
        assert got_meta == want_meta, path
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), path
        # the files people publish repeat byte for byte, whatever process wrote them (metadata in a fixed order)
        assert (actual / path).read_bytes() == (expected / path).read_bytes(), path
    for path in files[".parquet"]:
        pd.testing.assert_frame_equal(pd.read_parquet(actual / path), pd.read_parquet(expected / path), obj=str(path))


def resumed_tasks(workdir: Path) -> list[str]:
    return sorted(log.stem for log in (workdir / FINETUNE_LOGS).glob("*.log") if "resumed from" in log.read_text())


def test_fine_tune_killed_by_sigterm_resumes_on_the_next_run(reference_run, tmp_path):
    vectors = [f"results/taskvectors/effnet/eps4/dp_merging/s0/{task}.safetensors" for task in ("digits", "textures")]
    share_study_key(reference_run, tmp_path)
    victim = start_snakemake(tmp_path, *local_profile(), targets=vectors)
    checkpoint = wait_for_checkpoint(tmp_path, victim)
    # SIGTERM to Snakemake alone makes it finish its running jobs first (nothing to resume); a machine shutting
    # down or a terminal closing signals the whole process group, the fine-tune included
    os.killpg(victim.pid, signal.SIGTERM)
    output, _ = victim.communicate(timeout=120)
    assert victim.returncode != 0, output[-3000:]
    # the fine-tune left its checkpoint and released nothing
    assert checkpoint.exists()
    task = checkpoint.stem
    assert not (tmp_path / f"results/taskvectors/effnet/eps4/dp_merging/s0/{task}.safetensors").exists()

    finish(start_snakemake(tmp_path, *local_profile(), targets=vectors))
    assert task in resumed_tasks(tmp_path)
    assert not list((tmp_path / CHECKPOINTS).glob("*.pt"))  # removed once released
    assert_same_results(tmp_path, reference_run, released=4, tables=0)  # 2 task vectors, 2 heads


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        reason, refused = slurm_node.opted_out(), None
    except ValueError as error:
        reason, refused = None, str(error)
    if refused:
        pytest.fail(refused, pytrace=False)
    if reason:
        pytest.skip(reason)
    try:
        slurm_node.install()
        node = slurm_node.SlurmNode(tmp_path_factory.mktemp("slurm")).start()
    except slurm_node.Unavailable as why:
        pytest.skip(f"no real Slurm here: {why}")
    yield node
    node.stop()


# slurm first: an opted-out or unavailable cluster skips before the reference run is made
def test_slurm_profile_run_with_a_cancelled_fine_tune_matches_the_local_run(slurm, reference_run, tmp_path):
    share_study_key(reference_run, tmp_path)
    run = start_snakemake(
        tmp_path, "--workflow-profile", str(ROOT / "profiles/slurm"),
        # no accounting database on this cluster: poll with squeue (the plugin would wait on sacct forever)
        "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
        "--seconds-between-status-checks", "1",
        env={"DPMERGE_SLURM_PARTITION": "debug", "DPMERGE_SLURM_ACCOUNT": ""})
    task = wait_for_checkpoint(tmp_path, run).stem
    # what preemption looks like: the scheduler ends the job; Snakemake's retry (profile: retries) resubmits it
    victims = [job for job in slurm.jobs() if job["comment"].startswith("rule_finetune_")
               and job["comment"].endswith(f"_{task}") and job["state"] == "RUNNING"]
    assert len(victims) == 1, slurm.jobs()
    subprocess.run(["scancel", victims[0]["id"]], check=True)
    output = finish(run)

    jobs = slurm.jobs()
    attempts = [job for job in jobs if job["comment"] == victims[0]["comment"]]
    assert [job["state"] for job in attempts if job["id"] == victims[0]["id"]] == ["CANCELLED"], jobs
    assert [job["state"] for job in attempts if job["id"] != victims[0]["id"]] == ["COMPLETED"], jobs
    # every rule ran as its own sbatch job: pretrained, 2 prepares, 2 fine-tunes (+1 retry), the release group's
    # job (individual scores, TIES made and scored), weight averaging's own job (the configured diagnostics read
    # it), Table 1, the ledger
    assert len(jobs) == 10 and all(job["state"] in ("COMPLETED", "CANCELLED") for job in jobs), jobs
    assert task in resumed_tasks(tmp_path), output[-3000:]
    # 2 task vectors, 2 heads, 2 merges, the pretrained weights; 3 score files, Table 1, the ledger's 2 tables
    assert_same_results(tmp_path, reference_run, released=7, tables=6)


@pytest.mark.parametrize("value,runs", [(None, True), ("1", True), ("", True), ("0", False), ("false", False),
                                        ("off", False)])
def test_the_real_slurm_test_is_on_unless_the_variable_turns_it_off(value, runs):
    environ = {} if value is None else {slurm_node.OPT_OUT: value}
    reason = slurm_node.opted_out(environ)
    assert (reason is None) == runs
    assert runs or reason.startswith(f"DPMERGE_TEST_SLURM={value} turns the real-Slurm test off")


def test_an_unreadable_opt_out_value_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=r"DPMERGE_TEST_SLURM='maybe': expected 0 \(skip the real-Slurm test\)"):
        slurm_node.opted_out({slurm_node.OPT_OUT: "maybe"})


def test_opting_out_skips_the_real_slurm_test_with_its_reason_before_anything_runs(tmp_path):
    # no apt-get on this PATH: were the opt-out ignored, install() could not start installing Slurm here either,
    # and the skip would give the other reason
    env = {**snakemake_env(), "PATH": str(tmp_path), slurm_node.OPT_OUT: "0"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "--setup-show", "-p", "no:cacheprovider",
                             __file__, "-k", "test_slurm_profile_run"], capture_output=True, text=True, env=env,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 skipped" in result.stdout and "DPMERGE_TEST_SLURM=0 turns the real-Slurm test off" in result.stdout
    assert "SETUP    M slurm" in result.stdout and "reference_run" not in result.stdout  # no reference run made
