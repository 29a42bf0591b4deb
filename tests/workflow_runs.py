"""How the tests start the real workflow: this repository's Snakefile, run by this Python, with the package
importable by the jobs even without an installed copy."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile")]


def snakemake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "workflow"), **extra}


# One process imports Snakemake (about a second) and forks a child per dry run: each child parses the workflow
# from scratch, as `snakemake -n` would, without paying the import again.
_FORKED_DRY_RUNS = r"""
import os, sys
from snakemake.cli import main

snakefile, workdirs = sys.argv[1], sys.argv[2:]
for workdir in workdirs:
    pid = os.fork()
    if pid == 0:
        out = os.open(os.path.join(workdir, "dry_run.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        code = 1
        try:
            main(["--snakefile", snakefile, "--directory", workdir, "--cores", "2", "-n"])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(workdir, "dry_run.rc"), "w") as handle:
        handle.write(str(os.waitstatus_to_exitcode(status)))
"""


def dry_runs(workdirs: list[Path]) -> list[tuple[int, str]]:
    """(return code, output) of `snakemake -n` in each of `workdirs` (each holding its config.yaml), in order."""
    subprocess.run([sys.executable, "-c", _FORKED_DRY_RUNS, str(ROOT / "Snakefile"), *map(str, workdirs)],
                   env=snakemake_env(), check=True)
    return [(int((w / "dry_run.rc").read_text()), (w / "dry_run.out").read_text()) for w in workdirs]


TINY = {
    "results": "results",
    "seeds": [0],
    "epsilons": [4],
    "methods": ["naive_dp", "dp_merging"],
    "backbones": {
        # public_data: datasets declared public (outside every private training set) for RegMean's Grams
        "effnet": {"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32,
                   "tasks": ["digits", "textures"], "finetune": {"lr": 0.002}, "public_data": "lfw"},
        "minilm": {"kind": "minilm_l6", "trainable_blocks": 1, "max_length": 16,
                   "tasks": ["bbc_topic", "bbc_next_sentence"], "public_data": "tweet_sentiment"},
    },
    "data": {"max_train": 48, "max_test": 24},
    "finetune": {"epochs": 0.4, "batch_size": 8, "lr": 0.001},
    "merge": {"weight_averaging": {}, "ties": {"density": 0.2},
              "regmean": {"statistics": {"data": "public", "examples": 16}},
              "fisher": {"statistics": {"data": "private", "examples": 32, "clip_norm": 0.01, "epsilon": 1.0}},
              "dts_difference": {"operator": "dts", "vectors": "difference", "rank_fraction": 0.5}},
    # One more budget (Table 4, Fig. 3) and one more rho (Table 6) on effnet; Tables 5 and 7 lack their runs
    "sweeps": {"epsilon": {"epsilons": [8], "backbones": ["effnet"]},
               "rho": {"values": [0.2], "backbones": ["effnet"]}},
    "diagnostics": {"interpolation": {"operator": "weight_averaging", "points": 3, "max_examples": 24},
                    "curvature": {"operator": "weight_averaging", "iterations": 3, "gammas": [0.0, 1.0],
                                  "max_examples": 24},
                    "landscape": {"operator": "weight_averaging", "points": 3, "span": 0.5, "max_examples": 8}},
}


def snakemake(workdir, *args):
    env = snakemake_env()
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--cores", "2", *args],
                          capture_output=True, text=True, env=env)


def planned_jobs(output: str) -> dict[str, int]:
    """Parse the 'job count' table of a (dry) run."""
    table = output.split("Job stats:")[-1] if "Job stats:" in output else output
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)
            if m.group(1) != "total"}


def job_counts(workdir: Path, *args) -> dict[str, int]:
    result = subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--cores", "2", "-n", "--quiet", "rules",
                             *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", result.stdout, flags=re.M))
    return {rule: int(count) for rule, count in counts.items()}
