"""One run per results folder (dpmerge/run_lock.py): a second run from another working directory is refused with
the way out, and a lock never outlives the process that held it."""

import subprocess
import sys

import pytest
import yaml

from dpmerge import run_lock
from workflow_runs import SNAKEMAKE, snakemake_env

# the only merge is weight averaging: every diagnostic names it (none runs: seeds 0)
ONLY_WA = {"seeds": 0, **{d: {"operator": "weight_averaging"} for d in ("interpolation", "curvature", "landscape")}}

HOLD = "import sys, time; from dpmerge import run_lock; run_lock.acquire(sys.argv[1]); print('held', flush=True); " \
       "time.sleep(120)"


def hold(results):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(results)], stdout=subprocess.PIPE, text=True,
                              env=snakemake_env())
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_held_results_folder_is_refused_naming_its_holder_and_freed_when_the_holder_dies(tmp_path):
    results = tmp_path / "results"
    holder = hold(results)
    try:
        refused = rf"{results} is in use by another run \(pid {holder.pid} "
        with pytest.raises(run_lock.ResultsInUseError, match=refused):
            run_lock.acquire(results)
    finally:
        holder.kill()
        holder.wait()
    # the lock was the holder's open file: gone with it, nothing to clear by hand
    run_lock.acquire(results)
    run_lock._held.clear()


def test_a_second_checkout_on_the_same_results_folder_is_refused(tmp_path):
    results = tmp_path / "shared_results"
    config = {"results": str(results), "seeds": [0], "epsilons": [4], "methods": ["naive_dp"],
              "backbones": {"effnet": {"kind": "efficientnet_lite0", "image_size": 32,
                                       "tasks": ["digits", "textures"]}},
              "data": {"max_train": 48, "max_test": 24}, "finetune": {"epochs": 0.4, "batch_size": 8},
              "merge": {"weight_averaging": {}}, "tables": {"operator": "weight_averaging"}, "diagnostics": ONLY_WA}
    other = tmp_path / "other_checkout"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    holder = hold(results)
    try:
        result = subprocess.run([*SNAKEMAKE, "--directory", str(other), "--cores", "1"], capture_output=True,
                                text=True, env=snakemake_env(), timeout=300)
    finally:
        holder.kill()
        holder.wait()
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{results} is in use by another run (pid {holder.pid}" in output, output[-3000:]
    assert "Traceback" not in output
    assert not (results / "taskvectors").exists()  # refused before any job
