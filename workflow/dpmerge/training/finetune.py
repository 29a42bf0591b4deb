"""Private fine-tuning of one task: the loop around the DP step (training/dp_step.py), its settings, checkpoints
and the release's privacy record.

Methods (`METHODS`): nonprivate (plain AdamW), naive_dp (Eq. 4 + AdamW), dp_merging (Eq. 4-7 of "When Privacy
Hurts Mergeability", arXiv 2608.26655), dp_sam (w/o alignment: lambda = 0) and dp_anchor (w/o flatness: anchor on
one query per step).

Randomness: the Poisson sampler, the Gaussian noise and the head's initial weights draw from streams keyed by
the study's secret key and the fine-tune's full identity (privacy/randomness.py), never from the `seed` a release
records (the repetition index). What is spent is computed from the queries the loop counted, not from the
configured steps, and a release above its target is refused.
"""

from __future__ import annotations

import collections
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dpmerge.artifacts import atomic_write, tensors_sha256
from dpmerge.epsilon import NONPRIVATE_RECORDED
from dpmerge.methods import METHODS
from dpmerge.models.base import Backbone, TaskModel
from dpmerge.models.losses import task_loss
from dpmerge.privacy.accounting import (
    NEIGHBOURING,
    calibrate_noise_multiplier,
    check_relation,
    effective_noise_multiplier,
    spent_epsilon_of_steps,
)
from dpmerge.privacy.gaussian_mechanism import poisson_batch
from dpmerge.privacy.randomness import RNG_MODES, MechanismRandomness
from dpmerge.privacy.study_key import mechanism_fingerprint
from dpmerge.runtime import compute_line
from dpmerge.training.canaries import DiracCanaries, InputCanaries
from dpmerge.training.dp_step import adamw, method_update, privatized_gradient
from dpmerge.training.persample import STRATEGIES, make_clipper

# Opacus's backward hooks fire on the first trainable module, whose input (cached trunk features) never
# requires grad; torch warns about that on every step although per-sample gradients are exact (tested).
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")


@dataclass(frozen=True)
class FinetuneConfig:
    method: str
    target_epsilon: float | None  # None only for "nonprivate"
    epochs: float = 1.0  # passes over the data in expectation; steps = round(epochs / q)
    batch_size: int = 16  # expected Poisson batch size B; q = B / N
    clip_norm: float = 0.2  # C (paper: 0.2)
    lr: float = 1e-5  # paper: 1e-5 (CLIP/RoBERTa, full fine-tuning)
    weight_decay: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    rho: float = 0.05  # SAM radius (paper: 0.05)
    anchor_lambda: float = 0.05  # anchor strength lambda (paper: 0.05)
    accountant: str = "pld"  # exact for both relations; rdp/prv: add/remove only (privacy/accounting.py)
    delta: float | None = None  # None -> 1/N (the paper's); an explicit delta must be <= 1/N
    neighbouring: str = "replace_one"  # or "add_remove", which needs public_n
    public_n: int | None = None  # add/remove: the public dataset size q, steps and delta come from, never N
    rng: str = "keyed"  # "secure": sampler and noise from a CSPRNG (privacy/randomness.py)
    seed: int = 0  # repetition index; the randomness comes from the study key, not from this number
    log_every: int = 10
    per_sample_gradients: str = "auto"  # auto -> the backbone's choice; see training/persample.py (results identical)

    def __post_init__(self):
        betas = tuple(float(b) for b in self.betas)  # JSON configs give a list
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"finetune.betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", betas)
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; known methods: {', '.join(METHODS)}")
        if METHODS[self.method].private and not (self.target_epsilon and self.target_epsilon > 0):
            raise ValueError(f"method {self.method!r} needs a target epsilon > 0, got {self.target_epsilon}")
        if self.neighbouring not in NEIGHBOURING:
            raise ValueError(f"privacy.neighbouring must be one of {', '.join(NEIGHBOURING)}, "
                             f"got {self.neighbouring!r}")
        if METHODS[self.method].private:
            check_relation(self.accountant, self.neighbouring)
        if self.public_n is not None and not (isinstance(self.public_n, int) and self.public_n > 0):
            raise ValueError(f"privacy.public_n must be a positive integer, got {self.public_n!r}")
        if self.neighbouring == "add_remove" and METHODS[self.method].private and self.public_n is None:
            raise ValueError("privacy.neighbouring add_remove needs privacy.public_n, a public dataset size: under "
                             "add/remove N differs between neighbours, so q = B/N, delta = 1/N and a record carrying "
                             "N would reveal membership (use replace_one, the default, to treat N as public)")
        if self.rng not in RNG_MODES:
            raise ValueError(f"privacy.rng must be one of {', '.join(RNG_MODES)}, got {self.rng!r}")
        if self.per_sample_gradients not in ("auto", *STRATEGIES):
            raise ValueError(
                f"finetune.per_sample_gradients must be 'auto' or one of {', '.join(STRATEGIES)}, "
                f"got {self.per_sample_gradients!r}"
            )
        for field_name in ("batch_size", "epochs", "clip_norm", "lr"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(f"finetune.{field_name} must be positive, got {value!r}")


def _save_checkpoint(path: Path, fingerprint: dict, step: int, steps_by_queries: dict, params, optimizer, sampler,
                     noise, memory: dict) -> None:
    # Private (it holds the generators' states): never a release, kept under the results folder's checkpoints/.
    state = {
        "fingerprint": fingerprint,
        "step": step,
        "steps_by_queries": dict(steps_by_queries),
        "params": [p.detach().cpu() for p in params],
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.get_state(),
        "noise": noise.get_state(),
        # the step functions' state across steps (DPSAT's previous privatized gradient)
        "memory": {key: [t.detach().cpu() for t in value] for key, value in memory.items()},
    }
    atomic_write(path, lambda tmp: torch.save(state, tmp), private=True)


def _load_checkpoint(path: Path, fingerprint: dict, log) -> dict | None:
    """The saved state, or None (start clean) when there is none or it belongs to another run."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        saved = state["fingerprint"]
    except Exception as error:  # a truncated or foreign file: never trust it, never crash on it
        log(f"[finetune] checkpoint {path} is unreadable ({type(error).__name__}: {error}); starting clean")
        return None
    if saved != fingerprint:
        differing = sorted(k for k in fingerprint if saved.get(k) != fingerprint[k])
        log(f"[finetune] checkpoint {path} belongs to another run (differs in {differing}); starting clean")
        return None
    return state


@dataclass
class TrainingResult:
    task_vector: dict[str, torch.Tensor]
    head: dict[str, torch.Tensor]
    record: dict
    losses: list[float]  # non-private training losses (local diagnostics; never released)
    canaries: DiracCanaries | None = None  # an audit run's canaries (privacy/audit.py), with their secret coins


def head_only_inputs(model: TaskModel, features: tuple[torch.Tensor, ...], backbone: Backbone,
                     chunk: int = 256) -> tuple[torch.Tensor, ...]:
    """A head-only run's training inputs: w0's top applied once to every training example (in chunks, under the
    forward's precision) instead of at every step and query; `model` then runs its head alone on them. The top is
    frozen and dropout is off, so each example's pooled features are a fixed function of the example: the head's
    per-example gradients, clipping and noise are those of the per-step forward (up to float rounding)."""
    count = int(features[0].shape[0])
    with torch.no_grad(), backbone.autocast():
        pooled = [model._top(*(f[start:start + chunk].to(backbone.device) for f in features)).to("cpu")
                  for start in range(0, count, chunk)]
    model._top = _already_pooled
    return (torch.cat(pooled),)


def _already_pooled(pooled: torch.Tensor) -> torch.Tensor:
    return pooled


def finetune_identity(config: FinetuneConfig, identity: dict, pretrained_sha256: str, *,
                      data_sha256: str | None = None, num_examples: int | None = None,
                      per_sample_gradients: str | None = None) -> dict:
    """Everything that makes a fine-tune this mechanism and no other: the caller's names (backbone, task, method
    label, backbone settings), the pretrained weights, the training data's fingerprint and size, the per-sample
    gradient strategy that runs and every setting (target epsilon, seed index, sweep values, lr, ...). Two
    fine-tunes that differ in any of them draw independent randomness under one study key: two runs on different
    data of one size must not share batches and noise, or the difference of their releases cancels the noise."""
    settings = {k: v for k, v in asdict(config).items() if k != "log_every"}  # logging is not the mechanism
    if per_sample_gradients is not None:
        settings["per_sample_gradients"] = per_sample_gradients
    data = {} if data_sha256 is None else {"data_sha256": data_sha256, "num_examples": num_examples}
    return {"mechanism": "finetune", **identity, "pretrained_sha256": pretrained_sha256, **data,
            "settings": settings}


def finetune(
    backbone: Backbone,
    num_classes: int,
    train_features: tuple[torch.Tensor, ...],
    train_labels: torch.Tensor,
    config: FinetuneConfig,
    *,
    study_key: bytes,
    identity: dict,
    log=print,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 10,
    head: dict[str, torch.Tensor] | None = None,
    train_head: bool = True,
    audit_canaries: int = 0,
    input_canaries: InputCanaries | None = None,
) -> TrainingResult:
    """Fine-tune the backbone's top and a head on one task; return the task vector and privacy record.

    `study_key` (privacy/study_key.py) and `identity` (at least the backbone's and the task's names, and the method's
    label) key every random draw: the same key and identity reproduce the run bit for bit, anyone without the
    key cannot replay it, and any other identity draws independent randomness.

    The head starts from `head` when given (a CLIP zero-shot head, computed from public weights) and is
    frozen with ``train_head=False``, as the paper does for CLIP; otherwise it is a fresh head trained with the
    top (and privatized with it: it is part of every clipped per-example gradient).

    With `checkpoint`, the run saves its full state there every `checkpoint_every` steps and, when started
    again, resumes from it: the resumed run is bit-identical to an uninterrupted one (same batches, same noise)
    so the released vector and its privacy record are the same. Steps lost after the last checkpoint released
    nothing and are recomputed identically, so no budget is spent twice. The caller removes the file once the
    outputs are released (a crash before that resumes from it again).

    With `audit_canaries` = m > 0 the run is a privacy audit's (privacy/audit.py): m Dirac canaries
    (training/canaries.py) join the training set, each with probability 1/2, and the result carries them.
    With `input_canaries` (black-box), the included ones join the training set before anything is sampled.
    Such a run is never a release, and it is not checkpointed.
    """
    if (audit_canaries or input_canaries is not None) and checkpoint is not None:
        raise ValueError("an audit run is not checkpointed: its canaries' draws are not part of the saved state")
    method = METHODS[config.method]
    if input_canaries is not None:
        train_features, train_labels = input_canaries.training_set(tuple(train_features), train_labels)
    num_examples = int(train_labels.shape[0])
    if config.batch_size > num_examples:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {num_examples} training examples")
    # Under add/remove the released numbers come from the public size, never from N (see FinetuneConfig).
    public_size = config.neighbouring == "add_remove" and config.public_n is not None
    population, size_name = (config.public_n, "public_n") if public_size else (num_examples, "N")
    # delta <= 1/N: a larger delta admits mechanisms that publish one whole example outright. The default is the
    # paper's 1/N; the tolerance lets a delta typed as 1/N's decimal expansion pass.
    if config.delta is not None and method.private and not 0 < config.delta <= (1.0 / population) * (1 + 1e-9):
        raise ValueError(f"finetune.delta must be in (0, 1/{size_name}] = (0, {1.0 / population:.6g}] for "
                         f"{size_name} = {population}, got {config.delta}")
    sample_rate = min(1.0, config.batch_size / population)
    steps = max(1, round(config.epochs / sample_rate))
    delta = config.delta if config.delta is not None else 1.0 / population

    device = backbone.device
    strategy = (
        backbone.per_sample_strategy if config.per_sample_gradients == "auto" else config.per_sample_gradients
    )
    data_sha256 = tensors_sha256({"labels": train_labels, **{f"x{i}": f for i, f in enumerate(train_features)}})
    mechanism = finetune_identity(config, identity, backbone.checkpoint_sha256, data_sha256=data_sha256,
                                  num_examples=num_examples, per_sample_gradients=strategy)
    randomness = MechanismRandomness(study_key, mechanism, config.rng)
    sampler = randomness.stream("poisson_sampler", "cpu")
    noise = randomness.stream("gaussian_noise", device)  # drawn where the gradients are (same stream on resume)

    pretrained = backbone.top_state()
    with torch.random.fork_rng(devices=[]):  # the head's initial weights, without touching the caller's RNG
        torch.manual_seed(randomness.seed("head_init"))
        model = TaskModel(backbone, num_classes)
    if head is not None:
        model.head.load_state_dict(head)
    model.head.requires_grad_(train_head)
    # A head-only run leaves w0 as it is; the shared backbone's flags are restored when the run ends.
    frozen_top = [p for p in model.backbone_network.parameters() if p.requires_grad] if method.head_only else []
    for p in frozen_top:
        p.requires_grad_(False)
    model.train()
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    # Nothing to train (a head-only run with a frozen zero-shot head): no query touches the data, none is
    # accounted, and the release is w0 with the public head.
    trains = bool(params)
    if not trains:
        steps = 0
    per_sample = make_clipper(model, strategy, backbone.autocast) if method.private and trains else None
    backbone_prefix = "backbone_network."
    internal_pretrained = {name: value.to(device) for name, value in backbone.internal_state(pretrained).items()}
    anchors = [internal_pretrained.get(name.removeprefix(backbone_prefix)) for name in names]
    optimizer = (adamw(params, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas)
                 if trains else None)

    canaries = None
    if audit_canaries:
        canaries = DiracCanaries(
            {name: value.shape for name, value in pretrained.items()}, audit_canaries, config.clip_norm, sample_rate,
            randomness, backbone.internal_state,
            [name.removeprefix(backbone_prefix) if name.startswith(backbone_prefix) else None for name in names],
        )

    if method.private and trains:
        sigma = calibrate_noise_multiplier(
            config.target_epsilon, delta, sample_rate, steps, method.queries_per_step, config.accountant,
            config.neighbouring,
        )
    else:
        sigma = 0.0
    log(
        f"[finetune] method={config.method} {size_name}={population} q={sample_rate:.5f} steps={steps} "
        f"sigma={sigma:.4f} queries/step={method.queries_per_step} delta={delta:.3g}"
        + (f" neighbouring={config.neighbouring} randomness={config.rng} per-sample={strategy}"
           if method.private else "")
        + f" device={device} precision={backbone.precision} pretrained_sha256={backbone.checkpoint_sha256[:16]}..."
    )

    # What the accountant is charged comes from here, not from the configuration: every privatized query is
    # counted per step, and steps_by_queries[k] = how many steps made k queries on their batch.
    queries_this_step = 0
    steps_by_queries: collections.Counter = collections.Counter()

    def private_query(features, labels):
        nonlocal queries_this_step
        queries_this_step += 1
        return privatized_gradient(
            per_sample, features, labels, clip_norm=config.clip_norm, noise_multiplier=sigma,
            expected_batch_size=config.batch_size, noise=noise,
            extra_examples=canaries.add_to if canaries is not None else None,
        )

    def nonprivate_gradient(features, labels):
        optimizer.zero_grad(set_to_none=True)
        if labels.numel():
            with backbone.autocast():
                loss = task_loss(model(*features), labels)
            loss.backward()
        gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if canaries is not None:  # as examples of the mean loss
            canaries.add_to(gradients, scale=1.0 / max(int(labels.numel()), 1))
        return gradients

    first_step = 0
    memory: dict[str, list[torch.Tensor]] = {}  # what a step function keeps for the next step (method_update)
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        # Identifies the run a checkpoint belongs to.
        fingerprint = {
            "config": asdict(config),
            # the same study key and mechanism identity, or the resumed streams would not be this run's
            "randomness": mechanism_fingerprint(study_key, mechanism),
            # how the streams cut their draws over generators: a checkpoint from another layout cannot resume them
            "random_streams": [sampler.layout, noise.layout],
            "num_examples": num_examples,
            "data_sha256": data_sha256,
            "pretrained_sha256": backbone.checkpoint_sha256,
            "parameters": names,
            "sigma": sigma,
            # strategies agree only up to float rounding; a resume must reproduce the run bit for bit
            "per_sample_gradients": strategy,
            "precision": backbone.precision,
            "train_head": train_head,
            "head_sha256": tensors_sha256(head) if head is not None else None,
        }
        state = _load_checkpoint(checkpoint, fingerprint, log)
        if state is not None:
            with torch.no_grad():
                for p, value in zip(params, state["params"]):
                    p.copy_(value)
            optimizer.load_state_dict(state["optimizer"])
            sampler.set_state(state["sampler"])
            noise.set_state(state["noise"])
            first_step = state["step"]
            steps_by_queries.update(state["steps_by_queries"])
            memory.update({key: [t.to(device) for t in value] for key, value in state.get("memory", {}).items()})
            log(f"[finetune] resumed from {checkpoint} at step {first_step}/{steps}")

    if method.head_only and trains:
        pooling_started = time.perf_counter()
        train_features = head_only_inputs(model, train_features, backbone)
        log(compute_line("w0's top on the training set", time.perf_counter() - pooling_started))

    try:
        query = private_query if method.private else nonprivate_gradient
        hyperparameters = {name: getattr(config, name) for name in method.hyperparameters}
        losses: list[float] = []
        started = time.time()
        loop_started = time.perf_counter()
        for step in range(first_step, steps):
            batch = poisson_batch(num_examples, sample_rate, sampler)
            if canaries is not None:
                canaries.begin_step()
            features = tuple(f[batch].to(device, non_blocking=True) for f in train_features)
            labels = train_labels[batch].to(device)
            queries_this_step = 0
            update = method_update(method, query, params, anchors, features, labels, memory, **hyperparameters)
            steps_by_queries[queries_this_step] += 1
            for p, u in zip(params, update):
                p.grad = u
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if checkpoint is not None and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
                _save_checkpoint(checkpoint, fingerprint, step + 1, steps_by_queries, params, optimizer, sampler,
                                 noise, memory)
            if step % config.log_every == 0 or step == steps - 1:
                elapsed = time.time() - started
                rate = (step + 1 - first_step) / elapsed if elapsed > 0 else float("inf")
                # A private run's log shows progress only: its loss and real batch size are statistics of the
                # private data that nothing privatized, and logs get copied with results.
                observed = ""
                if not method.private:
                    with torch.no_grad(), backbone.autocast():
                        loss = task_loss(model(*features), labels).item() if labels.numel() else float("nan")
                    losses.append(loss)
                    observed = f" batch={labels.numel()} loss={loss:.4f}"
                log(
                    f"[finetune] step {step + 1}/{steps}{observed} "
                    f"elapsed={elapsed:.1f}s ({rate:.2f} steps/s, eta {(steps - step - 1) / rate:.0f}s)"
                )
        log(compute_line("training loop", time.perf_counter() - loop_started))
    except BaseException:
        backbone.load_top_state(pretrained)  # the shared backbone must not keep a half-trained top
        raise
    finally:
        if per_sample is not None:
            per_sample.close()  # remove hooks: the backbone is shared with later models in this process
        for p in frozen_top:
            p.requires_grad_(True)

    ran = {int(k): int(n) for k, n in sorted(steps_by_queries.items()) if k > 0}
    if method.private:
        spent = spent_epsilon_of_steps(sigma, sample_rate, ran, delta, config.accountant, config.neighbouring)
        if spent > config.target_epsilon:
            backbone.load_top_state(pretrained)
            raise RuntimeError(
                f"refusing to release: the {sum(ran.values())} steps that ran made {dict(ran)} (queries per step: "
                f"steps), which spends epsilon {spent:.4f} > target {config.target_epsilon}"
            )
    finetuned = backbone.top_state()
    task_vector = {name: finetuned[name] - pretrained[name] for name in pretrained}
    head = {name: value.detach().to("cpu", copy=True) for name, value in model.head.state_dict().items()}
    backbone.load_top_state(pretrained)  # leave the shared backbone as we found it
    record = {
        "method": config.method,
        "target_epsilon": config.target_epsilon if method.private else NONPRIVATE_RECORDED,
        "spent_epsilon": spent if method.private else NONPRIVATE_RECORDED,
        "delta": delta if method.private else 0.0,
        "noise_multiplier": sigma,
        "effective_noise_multiplier": effective_noise_multiplier(sigma, method.queries_per_step),
        "sample_rate": sample_rate,
        "steps": sum(steps_by_queries.values()),
        "clip_norm": config.clip_norm if method.private else None,
        "queries_per_step": method.queries_per_step,
        # what ran, as the accountant was charged: {queries made on one batch: steps}
        "steps_by_queries": {str(k): n for k, n in ran.items()},
        "accountant": config.accountant if method.private else None,
        "sampling": "poisson",
        "neighbouring": config.neighbouring,
        "randomness": config.rng,
        "seed": config.seed,
        "rho": config.rho if method.flatness else 0.0,
        "anchor_lambda": config.anchor_lambda if method.anchor else 0.0,
        "pretrained_sha256": backbone.checkpoint_sha256,
        # The checkpoint's hash says which file the weights came from; this one says what w0 holds, so a merge
        # can check its base is the w0 this vector is a difference from (stages/merge.py checked_base).
        "w0_sha256": tensors_sha256(pretrained),
        # N is public under replace-one; under add/remove it differs between neighbours and only the public size
        # the run was accounted with is released.
        "num_train_examples": num_examples if config.neighbouring == "replace_one" else None,
        "public_n": config.public_n if config.neighbouring == "add_remove" else None,
        "hyperparameters": {
            **{k: v for k, v in asdict(config).items() if k != "log_every"},
            "per_sample_gradients": strategy if method.private else None,
            "precision": backbone.precision,
            "train_head": train_head,
        },
    }
    return TrainingResult(task_vector, head, record, losses, canaries)
