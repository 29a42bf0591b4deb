"""What a DAG job costs beyond its own work: per rule, the sum of job wall times against the sum of in-job
compute, for the same small DAG run twice side by side: every job a fresh process (DPMERGE_FORKSERVER=0, how
every job ran before the fork server) and every job forked from the warm server (=1, the local default).

    .venv/bin/python bench/startup.py [--workdir /tmp/dpmerge-startup-bench] [--cores 2] [--order off,on]

The DAG is the embedded default's (config.yaml: its training budget, data sizes and settings) on a smaller
grid: both backbones, their first two tasks, naive DP and DP-Merging, one seed, weight averaging and task
arithmetic, the curvature and interpolation diagnostics. Wall time per job is Snakemake's benchmark file (`s`);
in-job compute is the sum of the job's `[compute]` log lines (dpmerge.runtime.compute_section: the training
loop, the merge, the evaluation, the statistics, a diagnostic's loops, the trunk features), so everything else
(process start, imports, loading and hashing inputs, calibration, writing) is overhead. Prints, per rule and
in all, the overhead's share of wall time in each mode and the ratio of wall times (on / off).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from dpmerge.cli_arguments import DescribedDefaultsShown

ROOT = Path(__file__).resolve().parents[1]
COMPUTE = re.compile(r"^\[compute\] .*: ([0-9.]+) s$", re.MULTILINE)
MODES = {"off": "0", "on": "1"}


def small_config(results: Path) -> dict:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    for spec in config["backbones"].values():
        spec["tasks"] = spec["tasks"][:2]
    config.update(results=str(results), seeds=[0], methods=["naive_dp", "dp_merging"],
                  merge={name: config["merge"][name] for name in ("weight_averaging", "task_arithmetic")})
    config["diagnostics"]["seeds"] = 1
    config["tables"]["operator"] = "task_arithmetic"
    return config


def run_mode(mode: str, workdir: Path, cores: int) -> float:
    folder = workdir / mode
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(small_config(folder / "results")))
    env = {**os.environ, "DPMERGE_FORKSERVER": MODES[mode]}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--cores",
                    str(cores), "--configfile", str(folder / "config.yaml"), "--workflow-profile",
                    str(ROOT / "profiles" / "local"), "--quiet"], cwd=folder, env=env, check=True)
    return time.perf_counter() - started


def per_rule(results: Path) -> dict[str, list[tuple[float, float]]]:
    """rule -> [(job wall s, job compute s)] from benchmark files and the logs beside them."""
    rules: dict[str, list[tuple[float, float]]] = {}
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        relative = tsv.relative_to(results / "benchmarks")
        wall = float(tsv.read_text().splitlines()[1].split("\t")[0])
        log = results / "logs" / relative.with_suffix(".log")
        compute = sum(float(s) for s in COMPUTE.findall(log.read_text())) if log.exists() else 0.0
        rules.setdefault(relative.parts[0], []).append((wall, compute))
    return rules


def overhead(jobs: list[tuple[float, float]]) -> tuple[float, float, float]:
    wall = sum(w for w, _ in jobs)
    compute = sum(c for _, c in jobs)
    return wall, compute, 100 * (1 - compute / wall) if wall else 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=DescribedDefaultsShown)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dpmerge-startup-bench"),
                        help="where both runs write (default: %(default)s)")
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores (default: %(default)s)")
    parser.add_argument("--order", default="off,on", help="modes in the order they run (default: %(default)s)")
    args = parser.parse_args(argv)
    order = args.order.split(",")
    if sorted(order) != sorted(MODES):
        parser.error(f"--order must name {', '.join(MODES)} once each")
    totals, rules = {}, {}
    for mode in order:
        print(f"[startup] DAG with DPMERGE_FORKSERVER={MODES[mode]} ...", file=sys.stderr, flush=True)
        totals[mode] = run_mode(mode, args.workdir, args.cores)
        rules[mode] = per_rule(args.workdir / mode / "results")
    print(f"{'rule':22s} {'jobs':>4s} | {'fresh process: wall':>19s} {'compute':>8s} {'overhead':>8s} | "
          f"{'forked: wall':>12s} {'compute':>8s} {'overhead':>8s} | wall on/off")
    everything = {mode: [] for mode in MODES}
    for rule in sorted(rules["off"]):
        off, on = rules["off"][rule], rules["on"].get(rule, [])
        everything["off"] += off
        everything["on"] += on
        (w0, c0, o0), (w1, c1, o1) = overhead(off), overhead(on)
        print(f"{rule:22s} {len(off):4d} | {w0:17.1f} s {c0:6.1f} s {o0:7.0f} % | {w1:10.1f} s {c1:6.1f} s "
              f"{o1:7.0f} % | {w1 / w0 if w0 else float('nan'):.2f}")
    (w0, c0, o0), (w1, c1, o1) = overhead(everything["off"]), overhead(everything["on"])
    print(f"{'all jobs':22s} {len(everything['off']):4d} | {w0:17.1f} s {c0:6.1f} s {o0:7.0f} % | {w1:10.1f} s "
          f"{c1:6.1f} s {o1:7.0f} % | {w1 / w0:.2f}")
    print(f"snakemake wall: fresh processes {totals['off']:.1f} s, forked {totals['on']:.1f} s, ratio "
          f"{totals['on'] / totals['off']:.2f} (--cores {args.cores})")


if __name__ == "__main__":
    main()
