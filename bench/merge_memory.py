"""Peak memory and wall time of every merge operator: streamed (`dpmerge merge`) vs everything in memory.

    .venv/bin/python bench/merge_memory.py [--tasks 8] [--workdir /tmp/dpmerge-merge-bench] [--reuse-inputs]
        [--operators ties regmean ties@difference ...] [--param wudi.iterations=30] [--relative-to ace]

Writes T random task vectors with the parameter shapes of ViT-B/32 (timm architecture, 87.5M float32
parameters, ~350 MB each) plus w0, then for every registered operator runs, each in a fresh process:
  stream     the `dpmerge merge` command (lazy safetensors reads, one tensor per task at a time)
  in-memory  load all T vectors, then merge the dicts (what a naive script does)
and prints wall time, peak RSS, and peak RSS above the bare interpreter (python + torch imported) in units of
one model. Targets: peak RSS <= 2.5x one model for every streamable operator (issue 4), streamed <= 1.5x for
every data-free one (issue 22; the last column, `-` where the operator reads data statistics).

With `--fusion-bench WHEEL` (`pip download fusion-bench==0.2.33 --no-deps`), a third mode runs fusion_bench's own
code in a fresh process the same way (all T vectors loaded, as its algorithms take them; the merged model
written): TSV-M, Iso-C and Iso-CTS through its utility functions as bench/spectral_compute.py loads them, TIES
through ties_merging_utils with its TiesMergingAlgorithm's steps (flatten, ties_merging, unflatten; threshold 20,
sum, as its config). Its WUDI needs Lightning and Hydra, which this environment does not install. Without the
wheel, issue 22's figures for fusion_bench (b03a37e, 8 vectors): TIES 13.6 s / 5.0 GB, WUDI (30 steps) 84 s /
2.2 GB, TSV-M 32.6 s, Iso-C 10.6 s (wall, including its import).

RegMean and Fisher read random statistics files in the `dpmerge statistics` format (a PSD Gram per weight
matrix, a Fisher diagonal per tensor, per task). Personalized operators (EMR, TALL masks, DTS) also write every
task's parts. WUDI's 300 Adam steps per matrix dominate its time; `--param wudi.iterations=N` times fewer.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from dpmerge.cli_types import DescribedDefaultsShown

HERE = Path(__file__).resolve().parent


def peak_rss_mib() -> float:
    """VmHWM: this process's peak resident set. (ru_maxrss would carry over the parent's peak across exec.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, workdir: Path, spec: str, tasks: int, hyper: dict, fusion_bench: Path | None) -> None:
    """Runs in a fresh process; prints its peak RSS in MiB as JSON. spec = OPERATOR or OPERATOR@difference."""
    operator, _, vectors = spec.partition("@")
    vectors = vectors or "task"
    sys.path.insert(0, str(HERE.parent / "workflow"))
    import torch  # noqa: F401

    from dpmerge import runtime
    from dpmerge.merge.registry import is_part
    from dpmerge.merge.specs import NEEDS_STATISTICS

    runtime.tune_allocator()  # as the CLI does, so both modes run with the same allocator

    baseline = peak_rss_mib()
    paths = [str(workdir / f"tv{i}.safetensors") for i in range(tasks)]
    out = workdir / f"merged_{operator}_{vectors}_{mode}.safetensors"
    start = time.perf_counter()
    if mode == "stream":
        from dpmerge.cli import main

        params = [arg for key, value in hyper.items() for arg in ("--param", f"{key}={json.dumps(value)}")]
        if operator in NEEDS_STATISTICS:
            params += ["--statistics", str(workdir / f"stats_{NEEDS_STATISTICS[operator]}.safetensors")]
        main(["merge", "--method", operator, "--vectors", vectors, *params,
              "--base", str(workdir / "w0.safetensors"), "-o", str(out), *paths])
    elif mode == "in-memory":
        from dpmerge.artifacts import load_tensors, save_tensors
        from dpmerge.merge.registry import merge

        base, _ = load_tensors(workdir / "w0.safetensors")
        loaded = [load_tensors(path)[0] for path in paths]
        statistics = None
        if operator in NEEDS_STATISTICS:
            everything, _ = load_tensors(workdir / f"stats_{NEEDS_STATISTICS[operator]}.safetensors")
            statistics = [{k.split("/", 1)[1]: v for k, v in everything.items() if k.startswith(f"{i}/")}
                          for i in range(tasks)]
        merged = merge(operator, loaded, vectors, statistics, **hyper)
        save_tensors(out, {key: value if is_part(key) else base[key] + value for key, value in merged.items()},
                     {"operator": operator})
    elif mode == "fusion_bench":
        run_fusion_bench(fusion_bench, operator, workdir, paths, out)
    elif mode != "baseline":
        raise ValueError(mode)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    print(json.dumps({"baseline_mib": baseline, "peak_mib": peak, "seconds": seconds}))
    out.unlink(missing_ok=True)


# fusion_bench's counterparts that load without its Lightning/Hydra package (see the module docstring).
FUSION_BENCH_OPERATORS = ("tsv_m", "iso_c", "iso_cts", "ties")


def run_fusion_bench(wheel: Path, operator: str, workdir: Path, paths: list[str], out: Path) -> None:
    import torch

    from dpmerge.artifacts import load_tensors, save_tensors
    from spectral_compute import _quiet, load_fusion_bench  # bench/, beside this script

    fb = load_fusion_bench(wheel)
    base, _ = load_tensors(workdir / "w0.safetensors")
    loaded = [load_tensors(path)[0] for path in paths]
    if operator == "tsv_m":
        merged = _quiet(fb["tsvm"].compute_and_sum_svd_mem_reduction, loaded, accelerator="cpu")
    elif operator == "iso_c":
        merged = _quiet(fb["iso"].iso_c, loaded, accelerator="cpu")
    elif operator == "iso_cts":
        merged = _quiet(fb["iso"].iso_cts, loaded, common_space_fraction=0.8, accelerator="cpu")
    elif operator == "ties":  # TiesMergingAlgorithm.run's steps, from fine-tuned checkpoints as its model pool
        ties = fb["ties"]
        for i, vector in enumerate(loaded):
            loaded[i] = {key: base[key] + value for key, value in vector.items()}
        flat_ft = torch.vstack([ties.state_dict_to_vector(check, []) for check in loaded])
        flat_ptm = ties.state_dict_to_vector(base, [])
        merged_tv = ties.ties_merging(flat_ft - flat_ptm, reset_thresh=20, merge_func="sum")
        model = ties.vector_to_state_dict(flat_ptm + 0.3 * merged_tv, base, [])
        save_tensors(out, dict(model), {"operator": "fusion_bench ties"})
        return
    else:
        raise ValueError(f"no fusion_bench counterpart run here for {operator}")
    save_tensors(out, {key: base[key] + merged[key] for key in base}, {"operator": f"fusion_bench {operator}"})


def write_inputs(workdir: Path, tasks: int) -> int:
    sys.path.insert(0, str(HERE.parent / "workflow"))
    import torch

    from dpmerge.artifacts import PRIVACY_FIELDS, save_released, save_tensors, tensors_sha256
    from dpmerge.models.reference_shapes import vit_b32_shaped

    model, _ = vit_b32_shaped()
    shapes = {name: p.shape for name, p in model.state_dict().items()}
    del model
    numel = sum(s.numel() for s in shapes.values())
    workdir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    w0 = {k: torch.randn(s, generator=generator) for k, s in shapes.items()}
    save_tensors(workdir / "w0.safetensors", w0, {"pretrained_sha256": "bench"})
    record = {field: 0 for field in PRIVACY_FIELDS}
    record.update(method="naive_dp", target_epsilon=4.0, spent_epsilon=3.99, delta=1e-5, seed=0,
                  pretrained_sha256="bench", accountant="rdp", sampling="poisson", w0_sha256=tensors_sha256(w0))
    del w0
    for i in range(tasks):
        vector = {k: 1e-3 * torch.randn(s, generator=generator) for k, s in shapes.items()}
        save_released(workdir / f"tv{i}.safetensors", vector, record, {"backbone": "vit_b32", "task": f"t{i}"})
        del vector
    write_statistics(workdir, shapes, tasks)
    return numel


def write_statistics(workdir: Path, shapes: dict, tasks: int) -> None:
    """Random statistics in the `dpmerge statistics` format: a PSD Gram per weight matrix (RegMean) and a
    positive Fisher diagonal per tensor (Fisher merging), per task, streamed to disk."""
    import torch

    from dpmerge.artifacts import file_tensors_sha256, write_tensors_streaming

    records = [{"task": f"t{i}", "source": "public", "examples": 256,
                "task_vector_sha256": file_tensors_sha256(workdir / f"tv{i}.safetensors")} for i in range(tasks)]
    for kind in ("gram", "fisher"):
        if kind == "gram":
            layout = {f"{i}/{k}": (torch.float32, (s[1], s[1])) for i in range(tasks) for k, s in shapes.items()
                      if len(s) == 2}
        else:
            layout = {f"{i}/{k}": (torch.float32, tuple(s)) for i in range(tasks) for k, s in shapes.items()}
        generator = torch.Generator().manual_seed(1)

        def produce():
            for name, (dtype, shape) in layout.items():
                if kind == "gram":
                    factor = torch.randn(shape[0], 64, generator=generator)
                    yield name, factor @ factor.T / 64 + 0.1 * torch.eye(shape[0])
                else:
                    yield name, torch.rand(shape, generator=generator)

        meta = {"artifact": "merge_statistics", "kind": kind, "source": "public",
                "tasks": [f"t{i}" for i in range(tasks)], "records": records}
        write_tensors_streaming(workdir / f"stats_{kind}.safetensors", layout, produce(), meta)


def print_relative(streamed: dict, reference: str, bare: float) -> None:
    """Each streamed operator's wall time and memory over the reference operator's, from this one run."""
    if reference not in streamed:
        raise SystemExit(f"--relative-to {reference}: it was not run streamed (add it to --operators)")
    ref = streamed[reference]
    print(f"\nstreamed, over {reference} (this run; peak above bare = peak RSS minus the bare interpreter's)")
    print(f"{'operator':18s} {'seconds':>9s} {'peak RSS':>9s} {'peak above bare':>16s}")
    for spec, r in streamed.items():
        above = (r["peak_mib"] - bare) / (ref["peak_mib"] - bare) if ref["peak_mib"] > bare else float("nan")
        print(f"{spec:18s} {r['seconds'] / ref['seconds']:9.2f} {r['peak_mib'] / ref['peak_mib']:9.2f} {above:16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=DescribedDefaultsShown)
    parser.add_argument("--tasks", type=int, default=8, help="task vectors merged")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dpmerge-merge-bench"),
                        help="where the inputs and merged models are written")
    parser.add_argument("--operators", nargs="+", default=None,
                        help="operators to time (default: all registered, then ties@difference); "
                             "NAME@difference merges difference vectors")
    parser.add_argument("--param", action="append", default=[], metavar="OPERATOR.KEY=VALUE",
                        help="hyperparameter for one operator, e.g. wudi.iterations=10 (repeatable)")
    parser.add_argument("--reuse-inputs", action="store_true",
                        help="keep the task vectors and statistics an earlier run wrote to --workdir for the same "
                             "--tasks (writing them takes minutes)")
    parser.add_argument("--modes", nargs="+", default=["stream", "in-memory"], choices=["stream", "in-memory"],
                        help="which of the two ways to run each operator")
    parser.add_argument("--fusion-bench", type=Path, default=None, metavar="WHEEL",
                        help="fusion_bench's wheel or unpacked source: also run its own code for "
                             f"{', '.join(FUSION_BENCH_OPERATORS)} (default: ours only)")
    parser.add_argument("--relative-to", default=None, metavar="OPERATOR",
                        help="also print every streamed operator's seconds and peak memory as ratios to this one's, "
                             "measured in the same run (e.g. ace against tsv_m, iso_cts and wudi)")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "OPERATOR", "HYPER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.workdir, args.child[1], args.tasks, json.loads(args.child[2]), args.fusion_bench)
        return
    hyper: dict[str, dict] = {}
    for item in args.param:
        name, _, assignment = item.partition(".")
        key, _, value = assignment.partition("=")
        hyper.setdefault(name, {})[key] = json.loads(value)

    stamp = args.workdir / "inputs.json"
    if args.reuse_inputs and stamp.exists() and json.loads(stamp.read_text())["tasks"] == args.tasks:
        numel = json.loads(stamp.read_text())["numel"]
    else:
        stamp.unlink(missing_ok=True)
        numel = write_inputs(args.workdir, args.tasks)
        stamp.write_text(json.dumps({"tasks": args.tasks, "numel": numel}))
    model_mib = numel * 4 / 2**20
    sys.path.insert(0, str(HERE.parent / "workflow"))
    from dpmerge.merge.registry import OPERATORS
    from dpmerge.merge.specs import NEEDS_STATISTICS

    def run(mode, spec):
        params = json.dumps(hyper.get(spec.partition("@")[0], {}))
        wheel = ["--fusion-bench", str(args.fusion_bench.resolve())] if mode == "fusion_bench" else []
        result = subprocess.run([sys.executable, __file__, "--tasks", str(args.tasks), "--workdir", str(args.workdir),
                                 *wheel, "--child", mode, spec, params], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-2000:])
        return json.loads(result.stdout.strip().splitlines()[-1])

    bare = run("baseline", "weight_averaging")["peak_mib"]
    print(f"{args.tasks} task vectors shaped like ViT-B/32 ({numel / 1e6:.1f}M float32 parameters, one model = "
          f"{model_mib:.0f} MiB); bare interpreter with torch: {bare:.0f} MiB")
    if hyper:
        print(f"hyperparameters other than the defaults: {hyper}")
    print(f"{'operator':18s} {'mode':12s} {'seconds':>8s} {'peak RSS MiB':>13s} {'models':>7s} {'above bare':>11s} "
          f"{'<= 1.5x':>8s}")
    against, streamed = [], {}
    for spec in args.operators or [*OPERATORS, "ties@difference", "dts@difference"]:
        modes = list(args.modes)
        if args.fusion_bench is not None and spec in FUSION_BENCH_OPERATORS:
            modes.append("fusion_bench")
        results = {}
        for mode in modes:
            r = results[mode] = run(mode, spec)
            within = "-" if mode != "stream" or spec.partition("@")[0] in NEEDS_STATISTICS else (
                "yes" if r["peak_mib"] <= 1.5 * model_mib else "NO")
            print(f"{spec:18s} {mode:12s} {r['seconds']:8.1f} {r['peak_mib']:13.0f} "
                  f"{r['peak_mib'] / model_mib:7.2f} {(r['peak_mib'] - bare) / model_mib:11.2f} {within:>8s}",
                  flush=True)
        if "stream" in results:
            streamed[spec] = results["stream"]
        if "fusion_bench" in results and "stream" in results:
            ours, theirs = results["stream"], results["fusion_bench"]
            against.append(f"{spec:18s} {ours['seconds'] / theirs['seconds']:9.2f} "
                           f"{ours['peak_mib'] / theirs['peak_mib']:13.2f}")
    if args.relative_to is not None:
        print_relative(streamed, args.relative_to, bare)
    if against:
        print("\nours streamed / fusion_bench's own code (one run each; wall includes reading and writing)")
        print(f"{'operator':18s} {'seconds':>9s} {'peak RSS':>13s}")
        print("\n".join(against))


if __name__ == "__main__":
    main()
