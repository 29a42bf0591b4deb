"""What a DAG job costs beyond its own work: per rule, the sum of job wall times against the sum of in-job
compute, for the same DAG run twice side by side: every job a fresh process (DPMERGE_FORKSERVER=0, how
every job ran before the fork server) and every job forked from the warm server (=1, the local default).

    .venv/bin/python bench/startup.py [--grid demo] [--workdir /tmp/dpmerge-startup-bench] [--cores 2]
                                      [--order off,on] [--results DIR]

--grid demo (the default) runs the demo itself, config.yaml as it is (every job of make demo but the report);
--grid small runs its settings on a smaller grid that also has diagnostics: both backbones, their first two tasks,
naive DP and DP-Merging, one seed, weight averaging and task arithmetic, the study's curvature and
interpolation. --order on runs the forked mode alone (the demo as users run it). Wall time per job is
Snakemake's benchmark file (`s`); in-job compute is the sum of the job's `[compute]` log lines
(dpmerge.runtime.compute_section: the training loop, the merge, the evaluation, the statistics, a diagnostic's
loops, the trunk features), so everything else (process start, imports, loading and hashing inputs,
calibration, writing) is overhead. Prints, per rule and in all, the overhead's share of wall time in each mode and
the ratio of wall times (on / off).
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

from dpmerge.cli_types import DescribedDefaultsShown

ROOT = Path(__file__).resolve().parents[1]
COMPUTE = re.compile(r"^\[compute\] .*: ([0-9.]+) s$", re.MULTILINE)
MODES = {"off": "0", "on": "1"}


def bench_config(grid: str, results: Path) -> dict:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["results"] = str(results)
    if grid == "demo":
        return config
    for spec in config["backbones"].values():
        spec["tasks"] = spec["tasks"][:2]
    config.update(seeds=[0], methods=["naive_dp", "dp_merging"],
                  merge={name: config["merge"][name] for name in ("weight_averaging", "task_arithmetic")})
    # the study's diagnostics (presets/study.yaml: lighter than the schema's defaults) on the one seed
    config["diagnostics"] = {**yaml.safe_load((ROOT / "presets" / "study.yaml").read_text())["diagnostics"], "seeds": 1}
    config["tables"]["operator"] = "task_arithmetic"
    return config


def run_mode(mode: str, grid: str, workdir: Path, cores: int) -> float:
    folder = workdir / mode
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(bench_config(grid, folder / "results")))
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
    parser.add_argument("--order", default="off,on",
                        help="modes in the order they run, or one mode alone (default: %(default)s)")
    parser.add_argument("--grid", choices=("demo", "small"), default="demo",
                        help="the demo's DAG (config.yaml) or the smaller one with diagnostics (default: %(default)s)")
    parser.add_argument("--results", type=Path, default=None,
                        help="read a run already made (its results folder, e.g. results) instead of running "
                             "(default: run)")
    args = parser.parse_args(argv)
    order = args.order.split(",")
    if len(set(order)) != len(order) or not set(order) <= set(MODES):
        parser.error(f"--order must name {' and/or '.join(MODES)}, each at most once")
    totals, rules = {}, {}
    if args.results:  # a run already made: its own benchmark files and logs, one mode
        rules[args.results.name] = per_rule(args.results)
    for mode in [] if args.results else order:
        print(f"[startup] DAG with DPMERGE_FORKSERVER={MODES[mode]} ...", file=sys.stderr, flush=True)
        totals[mode] = run_mode(mode, args.grid, args.workdir, args.cores)
        rules[mode] = per_rule(args.workdir / mode / "results")
    report(rules, totals, args.cores)


def report(rules: dict[str, dict], totals: dict[str, float], cores: int) -> None:
    """Per rule and in all, for each mode: jobs, Σ wall, Σ compute, overhead share; with both modes, the ratio."""
    modes = list(rules)
    both = set(modes) == set(MODES)
    label = {"off": "fresh process", "on": "forked"}
    print(f"{'rule':22s} {'jobs':>4s} | " + " | ".join(
        f"{label.get(m, m) + ': wall':>19s} {'compute':>8s} {'overhead':>8s}" for m in modes)
        + (" | wall on/off" if both else ""))
    rows = {rule: {m: rules[m].get(rule, []) for m in modes} for rule in sorted({r for m in modes for r in rules[m]})}
    rows["all jobs"] = {m: [job for jobs in rules[m].values() for job in jobs] for m in modes}
    for rule, jobs_of in rows.items():
        measured = {m: overhead(jobs_of[m]) for m in modes}
        cells = [f"{wall:17.1f} s {compute:6.1f} s {share:7.0f} %" for wall, compute, share in measured.values()]
        ratio = ""
        if both:
            off, on = measured["off"][0], measured["on"][0]
            ratio = f" | {on / off if off else float('nan'):.2f}"
        print(f"{rule:22s} {len(jobs_of[modes[0]]):4d} | " + " | ".join(cells) + ratio)
    if totals:
        print("snakemake wall: " + ", ".join(f"{label[m]} {t:.1f} s" for m, t in totals.items())
              + (f", ratio on/off {totals['on'] / totals['off']:.2f}" if set(totals) == set(MODES) else "")
              + f" (--cores {cores})")


if __name__ == "__main__":
    main()
