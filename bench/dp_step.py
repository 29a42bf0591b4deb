"""Cost of one fine-tuning step per method, as ratios to the non-private step, measured side by side.

    .venv/bin/python bench/dp_step.py [--batch-size 16] [--repeats 10]

For each embedded backbone top (the configured trainable_blocks), times nonprivate, naive_dp and dp_merging
steps interleaved in one process on the same batches, and prints median seconds and the ratios
naive_dp/nonprivate and dp_merging/naive_dp (expected ~2: two gradient queries per step).
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import dpmerge  # noqa: F401
from dpmerge.backbones import TaskModel, load_backbone
from dpmerge.finetune import METHODS, method_update, per_sample_module, privatized_gradient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    setups = {
        "efficientnet_lite0": (dict(trainable_blocks=1), torch.rand(args.batch_size, 3, 64, 64, generator=generator)),
        "minilm_l6": (dict(trainable_blocks=1, max_length=32),
                      ["a sentence of moderate length for timing the private step"] * args.batch_size),
    }
    print(f"batch {args.batch_size}, {args.repeats} repeats, {args.threads} thread(s); median seconds per step")
    for kind, (options, inputs) in setups.items():
        backbone = load_backbone(kind, **options)
        features = backbone.trunk_features(inputs)
        labels = torch.randint(0, 2, (args.batch_size,), generator=generator)
        model = TaskModel(backbone, 2)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        anchors = [p.detach().clone() for p in params]
        optimizer = torch.optim.AdamW(params, lr=1e-4)

        def nonprivate(f, y):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(*f), y).backward()
            return [p.grad for p in params]

        per_sample = per_sample_module(model)

        def private(f, y):
            return privatized_gradient(per_sample, f, y, clip_norm=0.2, noise_multiplier=1.0,
                                       expected_batch_size=args.batch_size, generator=generator)

        queries = {"nonprivate": nonprivate, "naive_dp": private, "dp_merging": private}
        times = {name: [] for name in queries}
        for _ in range(args.repeats + 1):  # first round warms up
            for name, query in queries.items():
                start = time.perf_counter()
                update = method_update(METHODS[name], query, params, anchors, features, labels, 0.05, 0.05)
                for p, u in zip(params, update):
                    p.grad = u
                optimizer.step()
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(values[1:]) for name, values in times.items()}
        print(f"{kind:20s} nonprivate {med['nonprivate']:.4f}s  naive_dp {med['naive_dp']:.4f}s  "
              f"dp_merging {med['dp_merging']:.4f}s  |  naive_dp/nonprivate {med['naive_dp'] / med['nonprivate']:.2f}  "
              f"dp_merging/naive_dp {med['dp_merging'] / med['naive_dp']:.2f}")
        per_sample._close()


if __name__ == "__main__":
    main()
