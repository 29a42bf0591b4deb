"""Cost of one private fine-tuning step, as ratios measured side by side in one process on the same batches.

    .venv/bin/python bench/dp_step.py [--models effnet minilm vit_b32 roberta_base] [--batch-size 16 64]
    python bench/dp_step.py --models vit_b32 --strategies bookkeeping --device cuda --precision bf16   # on a GPU

Models: the embedded backbones' trainable tops as configured (effnet: EfficientNet-Lite0 last block at 64 px,
minilm: all-MiniLM-L6-v2 last layer, 32 tokens) and two random-init models of the paper's shapes, trained
whole: ViT-B/32 (224 px, 88M parameters) and RoBERTa-base (128 tokens, 125M parameters).

For each model, every repeat runs, interleaved: a non-private AdamW step; a naive_dp step (Eq. 4) with each
per-example gradient strategy (persample.py: functorch, hooks, bookkeeping; plus Opacus's two-backward ghost
clipping for comparison); and, with the backbone's chosen strategy, a dp_merging step (Eq. 4-7, two queries),
a dp_sat_anchor step (DPSAT + anchor: the ascent from the previous step's privatized gradient, one query) and a
naive_dp step whose noise comes from privacy.rng: secure (SHAKE-256, four Gaussian draws per coordinate)
instead of the keyed torch generator, and one whose keyed noise comes from a single generator (no draw cut over
the stream's generators and threads, as before issue 22). It prints median seconds and the ratios
naive_dp/nonprivate per strategy, dp_merging/naive_dp, dp_sat_anchor/naive_dp, secure/keyed and keyed/one
generator. The first three are paired: the median over repeats of the ratio of the two steps timed back to back
in that repeat, with its distribution-free 95 % interval in brackets (bench/paired_ratio.py; at least 6 repeats
for an interval), so a reader sees whether a target is met or only touched; the others are ratios of medians.
It also times a nonprivate and a naive_dp step whose AdamW is torch's multi-tensor kernel instead of
the fused one the pipeline uses (training/dp_step.py: adamw) and prints naive_dp/nonprivate with that optimizer
and fused/multi-tensor for each: the fused kernel takes the same time off both steps, so it shortens every
step and raises the ratio.
Each model is timed at every --batch-size given: 16 is the paper's batch for full fine-tuning (ViT-B/32,
RoBERTa-base); the embedded tops train at config.yaml's finetune.batch_size (64), where a step's fixed costs
(noise: one Gaussian per parameter, whatever the batch) weigh a quarter as much.
Steps run as in a `dpmerge` job: libgomp's idle workers spin for openmp_wait.SPIN_COUNT iterations unless
GOMP_SPINCOUNT or OMP_WAIT_POLICY is set (GOMP_SPINCOUNT=300000 gives libgomp's default, to compare).
Targets: naive_dp <= 1.5x non-private with the chosen strategy, dp_merging <= 2.1x naive_dp (issue 3);
dp_sat_anchor <= 1.1x naive_dp (issue 21: one query, plus a perturbation and a copy of the gradient).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import time

from dpmerge.openmp_wait import limit_spinning

limit_spinning(os.environ)  # as `dpmerge` does, before torch loads libgomp: the steps timed are the pipeline's

import torch
import torch.nn.functional as F

from dpmerge import runtime
from dpmerge.cli_types import DescribedDefaultsShown
from dpmerge.methods import METHODS
from dpmerge.models.base import Backbone, TaskModel
from dpmerge.models.reference_shapes import roberta_base_shaped, vit_b32_shaped
from dpmerge.models.registry import load_backbone
from dpmerge.privacy.gaussian_mechanism import clip_factors
from dpmerge.privacy.randomness import GeneratorStream, MechanismRandomness
from dpmerge.training.dp_step import adamw, method_update, privatized_gradient
from dpmerge.training.persample import make_clipper
from paired_ratio import describe  # bench/, beside this script

BENCH_KEY = bytes(32)  # timing only: nothing trained here is released


class OpacusGhostClipper:
    """Opacus's ghost clipping: a backward pass for per-example norms, then a second on the reweighted loss."""

    strategy = "opacus_ghost"

    def __init__(self, model):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        self.module = GradSampleModuleFastGradientClipping(model, loss_reduction="sum", use_ghost_clipping=True)
        self.module.disable_hooks()  # on only inside queries, so the interleaved non-private steps do not pay
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    def clipped_sum(self, features, labels, clip_norm, into=None, scale=1.0):
        self.module.enable_hooks()
        losses = F.cross_entropy(self.module(*features), labels, reduction="none")
        losses.sum().backward(retain_graph=True)
        norms = self.module.get_norm_sample()
        self.module.disable_hooks()
        for p in self.params:
            p.grad = None
        (clip_factors(norms.detach() ** 2, clip_norm) * losses).sum().backward()
        sums = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        if into is None:
            return sums
        for target, value in zip(into, sums):
            target.add_(value, alpha=scale)
        return into

    def close(self):
        self.module._close()


def embedded(kind, options, make_inputs):
    def build(batch_size, generator):
        backbone = load_backbone(kind, **options)
        features = backbone.trunk_features(make_inputs(batch_size, generator))
        model = TaskModel(backbone, 2)
        model.train()
        labels = torch.randint(0, 2, (batch_size,), generator=generator)
        return model, features, labels, backbone.per_sample_strategy

    return build


def reference(factory):
    def build(batch_size, generator):
        model, make_batch = factory()
        features, labels = make_batch(batch_size, generator)
        return model, features, labels, Backbone.per_sample_strategy  # what a backbone gets unless it overrides

    return build


MODELS = {
    "effnet": embedded("efficientnet_lite0", dict(trainable_blocks=1),
                       lambda b, g: torch.rand(b, 3, 64, 64, generator=g)),
    "minilm": embedded("minilm_l6", dict(trainable_blocks=1, max_length=32),
                       lambda b, g: ["a sentence of moderate length for timing the private step"] * b),
    "vit_b32": reference(vit_b32_shaped),
    "roberta_base": reference(roberta_base_shaped),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=DescribedDefaultsShown)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help="models to time")
    parser.add_argument("--strategies", nargs="+", default=["functorch", "hooks", "bookkeeping", "opacus_ghost"],
                        help="per-example gradient strategies to time")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[16],
                        help="examples per step; several: each model is timed at each")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds per configuration, after one warm-up")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="torch device (cuda: timed with synchronisation, peak "
                                                         "memory per step reported)")
    parser.add_argument("--no-secure", action="store_true",
                        help="skip the secure-randomness step (SHAKE-256 on the CPU: seconds per step at ViT scale)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: forward and backward under bfloat16 autocast (clipping, noise and AdamW in fp32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    print(f"batch {', '.join(map(str, args.batch_size))}, {args.repeats} repeats (after one warm-up), "
          f"{args.threads} thread(s), {device} {args.precision}; median seconds per step (forward, backward, clipping, "
          "noise, AdamW)")

    def autocast():
        return (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())

    for name, batch_size in ((name, batch_size) for name in args.models for batch_size in args.batch_size):
        generator = torch.Generator().manual_seed(0)
        model, features, labels, chosen = MODELS[name](batch_size, generator)
        model.to(device)
        features = tuple(f.to(device) if isinstance(f, torch.Tensor) else f for f in features)
        labels = labels.to(device)
        params = [p for p in model.parameters() if p.requires_grad]
        anchors = [p.detach().clone() for p in params]
        optimizer = adamw(params, lr=1e-6)  # the pipeline's (fused where torch has the kernel)
        multi_tensor = torch.optim.AdamW(params, lr=1e-6, foreach=True)  # torch's default before it

        # bound now: the loop deletes these names before the next model is built
        def nonprivate(f, y, model=model, params=params, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(model(*f), y)
            loss.backward()
            return [p.grad for p in params]

        # Opacus allows one wrapper per model at a time, so strategies are timed one block after another;
        # each block interleaves its private steps with non-private ones and its ratios use that block's base.
        print(f"\n{name}, batch {batch_size}: {sum(p.numel() for p in params) / 1e6:.1f}M trainable parameters; "
              f"chosen strategy: {chosen}")
        keyed = MechanismRandomness(BENCH_KEY, {"bench": name}, "keyed").stream("gaussian_noise", device)
        secure = MechanismRandomness(BENCH_KEY, {"bench": name}, "secure").stream("gaussian_noise", device)
        one_generator = GeneratorStream(keyed.generator)  # the stream's first generator alone: nothing cut
        for strategy in dict.fromkeys([chosen, *args.strategies]):
            clipper = (OpacusGhostClipper(model) if strategy == "opacus_ghost"
                       else make_clipper(model, strategy, autocast))

            def private(f, y, clipper=clipper, noise=keyed):
                return privatized_gradient(clipper, f, y, clip_norm=0.2, noise_multiplier=1.0,
                                           expected_batch_size=batch_size, noise=noise)

            def private_secure(f, y, clipper=clipper):
                return private(f, y, clipper, secure)

            def private_one_generator(f, y, clipper=clipper):
                return private(f, y, clipper, one_generator)

            runs = {"nonprivate": ("nonprivate", nonprivate, optimizer),
                    "naive_dp": ("naive_dp", private, optimizer)}
            if strategy == chosen:
                runs["dp_merging"] = ("dp_merging", private, optimizer)
                runs["dp_sat_anchor"] = ("dp_sat_anchor", private, optimizer)
                if not args.no_secure:
                    runs["naive_dp_secure"] = ("naive_dp", private_secure, optimizer)
                if len(keyed.generators) > 1:
                    runs["naive_dp_one_generator"] = ("naive_dp", private_one_generator, optimizer)
                if device.type in ("cpu", "cuda"):  # where adamw() fuses
                    runs["nonprivate_multi_tensor"] = ("nonprivate", nonprivate, multi_tensor)
                    runs["naive_dp_multi_tensor"] = ("naive_dp", private, multi_tensor)
            times = {label: [] for label in runs}
            peaks = {label: 0 for label in runs}
            memories = {label: {} for label in runs}  # DPSAT's previous gradient, carried across repeats
            for repeat in range(args.repeats + 1):
                for label, (method, query, step_optimizer) in runs.items():
                    gc.collect()
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                    start = time.perf_counter()
                    update = method_update(METHODS[method], query, params, anchors, features, labels, memories[label],
                                           rho=0.05, anchor_lambda=0.05)
                    for p, u in zip(params, update):
                        p.grad = u
                    step_optimizer.step()
                    step_optimizer.zero_grad(set_to_none=True)
                    if cuda:
                        torch.cuda.synchronize()
                        peaks[label] = max(peaks[label], torch.cuda.max_memory_allocated())
                    if repeat:  # the first round warms up (vmap tracing, allocator)
                        times[label].append(time.perf_counter() - start)
            clipper.close()
            med = {label: statistics.median(values) for label, values in times.items()}
            line = (f"  {strategy:13s} nonprivate {med['nonprivate']:7.3f}s  naive_dp {med['naive_dp']:7.3f}s  "
                    f"naive_dp/nonprivate {describe(times['naive_dp'], times['nonprivate'])}")
            if "dp_merging" in med:
                line += (f"  dp_merging {med['dp_merging']:7.3f}s  "
                         f"dp_merging/naive_dp {describe(times['dp_merging'], times['naive_dp'])}  "
                         f"dp_sat_anchor {med['dp_sat_anchor']:7.3f}s  "
                         f"dp_sat_anchor/naive_dp {describe(times['dp_sat_anchor'], times['naive_dp'])}")
                if "naive_dp_secure" in med:
                    line += (f"  secure {med['naive_dp_secure']:7.3f}s  "
                             f"secure/keyed {med['naive_dp_secure'] / med['naive_dp']:5.2f}")
                if "naive_dp_one_generator" in med:
                    line += (f"  one generator {med['naive_dp_one_generator']:7.3f}s  "
                             f"keyed/one generator {med['naive_dp'] / med['naive_dp_one_generator']:5.2f}  "
                             f"one generator/nonprivate {med['naive_dp_one_generator'] / med['nonprivate']:5.2f}")
                if "nonprivate_multi_tensor" in med:
                    line += (f"  with multi-tensor AdamW: nonprivate {med['nonprivate_multi_tensor']:7.3f}s  "
                             f"naive_dp {med['naive_dp_multi_tensor']:7.3f}s  naive_dp/nonprivate "
                             f"{med['naive_dp_multi_tensor'] / med['nonprivate_multi_tensor']:5.2f}  "
                             f"fused/multi-tensor nonprivate {med['nonprivate'] / med['nonprivate_multi_tensor']:5.2f}"
                             f"  naive_dp {med['naive_dp'] / med['naive_dp_multi_tensor']:5.2f}")
            if cuda:
                line += "  peak GiB " + " ".join(f"{label} {peak / 2**30:.2f}" for label, peak in peaks.items())
            print(line, flush=True)
        del model, params, anchors, optimizer, multi_tensor, features
        gc.collect()


if __name__ == "__main__":
    runtime.make_torchvision_importable()
    runtime.tune_allocator()
    main()
