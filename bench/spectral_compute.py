"""Compute time of the spectral merges (TSV-M, Iso-C, Iso-CTS) against fusion_bench's own code, side by side.

    .venv/bin/python bench/spectral_compute.py --fusion-bench fusion_bench-0.2.33-py3-none-any.whl
        [--tasks 8] [--blocks 2] [--repeats 3] [--threads 2]

Builds T random task vectors shaped like `--blocks` transformer blocks of ViT-B (qkv 2304 x 768, out proj
768 x 768, fc1 3072 x 768, fc2 768 x 3072, their biases and layer norms) and times, in one process and
alternating (ours, theirs, ours, ...) so both see the same machine:
  ours    dpmerge.merge.registry.merge(operator, vectors) on in-memory vectors (the streamed command's per-tensor
          code, without file reads)
  theirs  fusion_bench's compute_and_sum_svd_mem_reduction, iso_c and iso_cts (accelerator "cpu"), run from
          fusion_bench's own source files (the wheel or an unpacked copy: `pip download fusion-bench==0.2.33
          --no-deps`); its package __init__ imports Lightning and Hydra, so only the utility modules are
          loaded, with the two helpers they import (a timer, a type alias) stubbed
It prints the median seconds of each, the ratio ours / theirs (issue 22's target: <= 0.5) as the median of the
runs' paired ratios (ours in a run over theirs right after it) with its distribution-free 95 % interval
(bench/paired_ratio.py; --repeats 6 or more for an interval), the largest
absolute difference between the two merged vectors beside the largest entry, and each one's largest error
against fusion_bench's algorithm run once in float64 (float32 SVDs are themselves ~1e-4 of the largest entry
from it). Without --fusion-bench only ours is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import types
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflow"))

from dpmerge.cli_types import DescribedDefaultsShown  # noqa: E402
from paired_ratio import describe  # noqa: E402  (bench/, beside this script)

FILES = {"tsvm": "fusion_bench/method/task_singular_vector/utils/TSVM_utils.py",
         "iso": "fusion_bench/method/isotropic_merging/iso_utils.py",
         "ties": "fusion_bench/method/ties_merging/ties_merging_utils.py"}


def vit_blocks(blocks: int, tasks: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    shapes = {}
    for b in range(blocks):
        prefix = f"blocks.{b}."
        shapes.update({prefix + "attn.qkv.weight": (2304, 768), prefix + "attn.qkv.bias": (2304,),
                       prefix + "attn.proj.weight": (768, 768), prefix + "attn.proj.bias": (768,),
                       prefix + "mlp.fc1.weight": (3072, 768), prefix + "mlp.fc1.bias": (3072,),
                       prefix + "mlp.fc2.weight": (768, 3072), prefix + "mlp.fc2.bias": (768,),
                       prefix + "norm1.weight": (768,), prefix + "norm2.weight": (768,)})
    return [{name: 1e-3 * torch.randn(shape, generator=generator) for name, shape in shapes.items()}
            for _ in range(tasks)]


def _source(location: Path, relative: str) -> str:
    if location.is_file():
        with zipfile.ZipFile(location) as wheel:
            return wheel.read(relative).decode()
    return (location / relative).read_text()


def load_fusion_bench(location: Path) -> dict[str, types.ModuleType]:
    """fusion_bench's merge utility modules (FILES), run from its own source, with its package's heavy imports
    stubbed."""
    utils = types.ModuleType("fusion_bench.utils")
    utils.timeit_context = lambda *args, **kwargs: contextlib.nullcontext()
    type_module = types.ModuleType("fusion_bench.utils.type")
    type_module.StateDictType = dict
    sys.modules.update({"fusion_bench": types.ModuleType("fusion_bench"), "fusion_bench.utils": utils,
                        "fusion_bench.utils.type": type_module})
    modules = {}
    for name, relative in FILES.items():
        module = types.ModuleType(f"fusion_bench_{name}")
        exec(compile(_source(location, relative), relative, "exec"), module.__dict__)
        modules[name] = module
    return modules


def _quiet(function, *args, **kwargs):
    """fusion_bench prints a line per tensor; the timing should not include the terminal."""
    with contextlib.redirect_stdout(None):
        return function(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=DescribedDefaultsShown)
    parser.add_argument("--fusion-bench", type=Path, default=None,
                        help="fusion_bench's wheel or unpacked source (default: time ours only)")
    parser.add_argument("--tasks", type=int, default=8, help="task vectors merged")
    parser.add_argument("--blocks", type=int, default=2, help="ViT-B blocks per vector (7.1M parameters each)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the same for both)")
    parser.add_argument("--operators", nargs="+", default=["tsv_m", "iso_c", "iso_cts"],
                        choices=["tsv_m", "iso_c", "iso_cts"], help="operators timed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from dpmerge.merge.registry import merge

    vectors = vit_blocks(args.blocks, args.tasks)
    parameters = sum(t.numel() for t in vectors[0].values())
    print(f"{args.tasks} task vectors of {parameters / 1e6:.1f}M parameters ({args.blocks} ViT-B blocks), "
          f"{args.threads} threads, {args.repeats} alternating runs each; median seconds")
    theirs = {}
    if args.fusion_bench is not None:
        fb = load_fusion_bench(args.fusion_bench)
        algorithms = {
            "tsv_m": lambda given: _quiet(fb["tsvm"].compute_and_sum_svd_mem_reduction, given, accelerator="cpu"),
            "iso_c": lambda given: _quiet(fb["iso"].iso_c, given, accelerator="cpu"),
            "iso_cts": lambda given: _quiet(fb["iso"].iso_cts, given, common_space_fraction=0.8, accelerator="cpu")}
        theirs = {name: (lambda algorithm=algorithm: algorithm(vectors)) for name, algorithm in algorithms.items()}
    ours = {"tsv_m": lambda: merge("tsv_m", vectors, include_conv=False),
            "iso_c": lambda: merge("iso_c", vectors, include_conv=False),
            "iso_cts": lambda: merge("iso_cts", vectors, common_space_fraction=0.8, include_conv=False)}
    print("| operator | ours s | fusion_bench s | ours / fusion_bench [95 % interval] | max abs difference "
          "| max abs entry | ours - float64 | fusion_bench - float64 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for operator in args.operators:
        times = {"ours": [], "theirs": []}
        results = {}
        for _ in range(args.repeats):
            for who, function in (("ours", ours[operator]), ("theirs", theirs.get(operator))):
                if function is None:
                    continue
                start = time.perf_counter()
                results[who] = function()
                times[who].append(time.perf_counter() - start)
        mine = statistics.median(times["ours"])
        if "theirs" in results:
            other = statistics.median(times["theirs"])
            difference = max(float((results["ours"][k] - results["theirs"][k]).abs().max()) for k in vectors[0])
            largest = max(float(results["theirs"][k].abs().max()) for k in vectors[0])
            exact = algorithms[operator]([{k: v.double() for k, v in vector.items()} for vector in vectors])
            errors = [max(float((results[who][k].double() - exact[k]).abs().max()) for k in vectors[0])
                      for who in ("ours", "theirs")]
            print(f"| {operator} | {mine:.2f} | {other:.2f} | {describe(times['ours'], times['theirs']).strip()} "
                  f"| {difference:.1e} | {largest:.1e} "
                  f"| {errors[0]:.1e} | {errors[1]:.1e} |")
        else:
            print(f"| {operator} | {mine:.2f} | -- | -- | -- | -- | -- | -- |")


if __name__ == "__main__":
    main()
