"""GPU readiness check (issue 6): ViT-B/32 through the real CLIP loader, one task, a few hundred DP steps.

For a machine with a GPU but no network (open_clip's ViT-B-32 architecture with random weights, written to a
checkpoint and read back by `dpmerge.models.clip.OpenCLIPViT`; synthetic 224 px images; a zero-shot head from the text
tower). Per (method, precision) it runs `finetune` on the device and reports seconds per step and peak GPU
memory, and, measured in the same run, the ratio to a non-private step: the numbers a researcher needs to size
Slurm jobs. Writes a JSON file beside printing a table.

    python bench/gpu_readiness.py --steps 200 --out gpu_readiness.json          # on the GPU machine
    python bench/gpu_readiness.py --model tiny --steps 5 --device cpu           # smoke test anywhere
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import torch

from dpmerge import runtime
from dpmerge.cli_types import DescribedDefaultsShown


def build_backbone(model: str, directory: Path, device: str, precision: str):
    import open_clip

    from dpmerge.models.registry import load_backbone
    from dpmerge.models.standins import write_tiny_clip

    if model == "tiny":
        config, checkpoint = write_tiny_clip(directory)
        return load_backbone("open_clip", model=str(config), checkpoint=str(checkpoint),
                             pretrained="").set_device(device, precision)
    torch.manual_seed(0)
    clip = open_clip.create_model(model, pretrained=None, force_quick_gelu=True)
    checkpoint = directory / f"{model}.bin"
    torch.save(clip.state_dict(), checkpoint)
    kind = {"ViT-B-32": "clip_vit_b32", "ViT-B-16": "clip_vit_b16", "ViT-L-14": "clip_vit_l14"}[model]
    return load_backbone(kind, checkpoint=str(checkpoint)).set_device(device, precision)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=DescribedDefaultsShown)
    parser.add_argument("--model", default="ViT-B-32", help="ViT-B-32, ViT-B-16, ViT-L-14, or tiny")
    parser.add_argument("--device", default="cuda", help="torch device")
    parser.add_argument("--steps", type=int, default=200, help="DP steps per measured run")
    parser.add_argument("--batch-size", type=int, default=16, help="expected Poisson batch size (paper: 16)")
    parser.add_argument("--examples", type=int, default=2000, help="synthetic training examples")
    parser.add_argument("--classes", type=int, default=10, help="classes of the synthetic task")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], help="precisions to time")
    parser.add_argument("--methods", nargs="+", default=["nonprivate", "naive_dp", "dp_merging"],
                        help="methods to time")
    parser.add_argument("--out", default="gpu_readiness.json", help="JSON file of the measurements")
    args = parser.parse_args()

    from dpmerge.training.finetune import FinetuneConfig, train

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions:
            backbone = build_backbone(args.model, Path(tmp), args.device, precision)
            size = backbone.image_size
            images = torch.randint(0, 256, (args.examples, 3, size, size), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(0))
            labels = torch.arange(args.examples) % args.classes
            head = backbone.zeroshot_head([f"class {i}" for i in range(args.classes)], [lambda c: f"a photo of a {c}."])
            epochs = args.steps * args.batch_size / args.examples
            for method in args.methods:
                config = FinetuneConfig(method=method, target_epsilon=None if method == "nonprivate" else 4.0,
                                        epochs=epochs, batch_size=args.batch_size, log_every=10**9)
                if backbone.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                lines: list[str] = []
                # timing only, nothing is released: a fixed key instead of a study's secret one
                result = train(backbone, args.classes, (images,), labels, config, study_key=bytes(32),
                                  identity={"bench": "gpu_readiness", "model": args.model}, log=lines.append,
                                  head=head, train_head=False)
                # The training loop's own clock (its last progress line, logged after a loss read-back that
                # synchronises the device); noise calibration before the loop is not a per-step cost.
                elapsed = float(re.search(r"elapsed=([0-9.]+)s", lines[-1]).group(1))
                rows.append({
                    "model": args.model, "device": str(backbone.device), "precision": precision, "method": method,
                    "steps": result.record["steps"], "seconds_per_step": elapsed / result.record["steps"],
                    "peak_gpu_mib": (torch.cuda.max_memory_allocated() / 2**20
                                     if backbone.device.type == "cuda" else None),
                    "noise_multiplier": result.record["noise_multiplier"],
                })
            del backbone
    base = {r["precision"]: r["seconds_per_step"] for r in rows if r["method"] == "nonprivate"}
    for row in rows:
        row["ratio_to_nonprivate"] = (row["seconds_per_step"] / base[row["precision"]]
                                      if row["precision"] in base else None)
    print(f"{'precision':9} {'method':11} {'steps':>5} {'s/step':>8} {'x nonpriv':>9} {'peak MiB':>9}")
    for row in rows:
        ratio = f"{row['ratio_to_nonprivate']:.2f}" if row["ratio_to_nonprivate"] else "-"
        peak = f"{row['peak_gpu_mib']:.0f}" if row["peak_gpu_mib"] else "-"
        print(f"{row['precision']:9} {row['method']:11} {row['steps']:5d} {row['seconds_per_step']:8.4f} {ratio:>9} "
              f"{peak:>9}")
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    runtime.make_torchvision_importable()
    runtime.tune_allocator()
    main()
