"""Each running GPU job sees only its own GPU (dpmerge/gpu_slots.py), checked without a GPU: by the ids the pool
hands out to concurrent processes, by the environment the `dpmerge` launcher gives a command, and by what jobs
of the real workflow, run with --resources gpu=2, write in their logs."""

import multiprocessing
import os
import subprocess
import sys
import time

import pytest
import yaml

from dpmerge import gpu_slots
from workflow_runs import SNAKEMAKE, snakemake_env


def test_the_pool_is_the_first_n_visible_devices_else_the_first_n_ids():
    assert gpu_slots.local_pool(0, "0,1") == [] and gpu_slots.local_pool(0, None) == []
    assert gpu_slots.local_pool(3, None) == ["0", "1", "2"] and gpu_slots.local_pool(2, "") == ["0", "1"]
    assert gpu_slots.local_pool(2, "5, 7,9") == ["5", "7"]
    with pytest.raises(gpu_slots.PoolError, match=r"gpu=3 but CUDA_VISIBLE_DEVICES='5,7' names 2 device"):
        gpu_slots.local_pool(3, "5,7")

    class Resource:
        value = 4

    assert gpu_slots.granted({"gpu": Resource()}) == 4 and gpu_slots.granted({"_cores": 2}) == 0


def _hold(folder, pool, claimed, release):
    claimed.put(gpu_slots.claim(pool, folder))
    release.wait()


@pytest.mark.slow
def test_concurrent_claims_get_distinct_devices_and_a_freed_device_is_reused(tmp_path):
    context = multiprocessing.get_context("spawn")
    claimed, releases = context.Queue(), [context.Event() for _ in range(3)]
    holders = [context.Process(target=_hold, args=(tmp_path, ["3", "4"], claimed, r)) for r in releases]
    for holder in holders[:2]:
        holder.start()
    first = sorted(claimed.get(timeout=60) for _ in range(2))
    assert first == ["3", "4"]  # two jobs, two devices
    holders[2].start()
    time.sleep(1.0)
    assert claimed.empty()  # the third waits: both devices are held
    releases[0].set()
    holders[0].join(timeout=60)
    third = claimed.get(timeout=60)
    assert third in first  # the device the first job freed (its process exited; no clean-up needed)
    for release in releases[1:]:
        release.set()
    for holder in holders[1:]:
        holder.join(timeout=60)


def test_the_launcher_gives_a_gpu_job_one_free_device_and_leaves_other_jobs_alone(tmp_path):
    context = multiprocessing.get_context("spawn")
    claimed, release = context.Queue(), context.Event()
    # another job already holds device 0 (in the real lock directory: the launcher uses that one)
    holder = context.Process(target=_hold, args=(gpu_slots.lock_directory(), ["0"], claimed, release))
    holder.start()
    try:
        assert claimed.get(timeout=60) == "0"
        script = ("import os, sys; from dpmerge import launch; sys.argv = ['dpmerge', '--help']; "
                  "import dpmerge.cli as cli; cli.main = lambda argv: print('CUDA_VISIBLE_DEVICES=' + "
                  "os.environ.get('CUDA_VISIBLE_DEVICES', '-')); launch.main()")
        env = snakemake_env(DPMERGE_FORKSERVER="0", DPMERGE_GPU_SLOTS="0,1")
        env.pop("CUDA_VISIBLE_DEVICES", None)
        gpu_job = subprocess.run([sys.executable, "-c", script], env={**env, "DPMERGE_GPU_JOB": "1"},
                                 capture_output=True, text=True, timeout=120)
        assert gpu_job.returncode == 0, gpu_job.stderr
        assert "CUDA_VISIBLE_DEVICES=1" in gpu_job.stdout and "runs on GPU 1" in gpu_job.stderr
        cpu_job = subprocess.run([sys.executable, "-c", script], env={**env, "DPMERGE_GPU_JOB": "0"},
                                 capture_output=True, text=True, timeout=120)
        assert "CUDA_VISIBLE_DEVICES=-" in cpu_job.stdout and "[gpu]" not in cpu_job.stderr
    finally:
        release.set()
        holder.join(timeout=60)


def test_workflow_jobs_that_ask_for_a_gpu_run_on_one_device_of_the_pool(tmp_path):
    """The real workflow on a machine without a GPU: the backbone asks for CUDA, so its jobs fail, but only
    after the launcher has claimed their device; each log says which, from the pool Snakemake was started with
    (CUDA_VISIBLE_DEVICES=5,7 and --resources gpu=2)."""
    config = {
        "results": "results", "seeds": [0], "epsilons": [4], "methods": ["naive_dp"],
        "backbones": {"effnet": {"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32,
                                 "device": "cuda", "tasks": ["digits", "textures"]}},
        "data": {"max_train": 48, "max_test": 24}, "finetune": {"epochs": 0.4, "batch_size": 8},
        "merge": {"weight_averaging": {}}, "tables": {"operator": "weight_averaging"},
        "diagnostics": {kind: {"operator": "weight_averaging"} for kind in ("interpolation", "curvature", "landscape")},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = snakemake_env(CUDA_VISIBLE_DEVICES="5,7", DPMERGE_FORKSERVER="0")
    targets = [f"results/data/effnet/{task}.pt" for task in ("digits", "textures")]
    done = subprocess.run([*SNAKEMAKE, *targets, "--directory", str(tmp_path), "--cores", "2", "--resources", "gpu=2",
                           "--keep-going", "--configfile", str(tmp_path / "config.yaml")],
                          capture_output=True, text=True, env=env, timeout=600)
    logs = {task: (tmp_path / f"results/logs/prepare/effnet/{task}.log").read_text() for task in ("digits", "textures")}
    for task, log in logs.items():
        assert any(f"runs on GPU {d} (CUDA_VISIBLE_DEVICES={d}; pool 5,7)" in log for d in ("5", "7")), \
            (task, log[-2000:], done.stderr[-2000:])
    # and the rule asked for it: the shell exported DPMERGE_GPU_JOB=1
    assert "export DPMERGE_GPU_JOB=1;" in done.stdout + done.stderr
    assert os.environ.get("DPMERGE_GPU_SLOTS") is None  # the test process itself was never given a pool
