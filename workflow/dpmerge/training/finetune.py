"""Private fine-tuning of one task: the loop around the DP step (training/dp_step.py), its settings, checkpoints
and the release's privacy record.

Methods: every one in dpmerge/methods.py's table (`METHODS`): nonprivate (plain AdamW), naive_dp (Eq. 4 + AdamW),
dp_merging (Eq. 4-7 of "When Privacy Hurts Mergeability", arXiv 2608.26655), its ablations dp_sam and dp_anchor,
DPSAT with and without the anchor, and pretrained_head (w0 kept, the head trained under DP).

Randomness: the Poisson sampler, the Gaussian noise and the head's initial weights draw from streams keyed by
the study's secret key and the fine-tune's full identity (privacy/randomness.py), never from the `seed` a release
records (the repetition index). What is spent is computed from the queries the loop counted, not from the
configured steps, and a release above its target is refused.
"""

from __future__ import annotations

import collections
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dpmerge.artifacts import tensors_sha256
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
from dpmerge.runtime import compute_line
from dpmerge.training.canaries import DiracCanaries
from dpmerge.training.checkpoint import resume, run_fingerprint, save_checkpoint
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
    # The fresh head's own learning rate (None: lr): a head starts at zero and needs many more steps at the top's
    # lr than a short private run has. Post-processing of the privatized gradient, so no privacy cost.
    head_lr: float | None = None
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
        for field_name in ("batch_size", "epochs", "clip_norm", "lr", "head_lr"):
            value = getattr(self, field_name)
            if field_name == "head_lr" and value is None:
                continue
            if not value > 0:
                raise ValueError(f"finetune.{field_name} must be positive, got {value!r}")


def parameter_groups(model: TaskModel, params: list[torch.Tensor], config: FinetuneConfig) -> list:
    """The trained parameters as AdamW sees them: one group at lr, or, with head_lr set, the head's parameters in
    a group of their own at head_lr."""
    if config.head_lr is None:
        return params
    head = {id(p) for p in model.head.parameters()}
    groups = [{"params": [p for p in params if id(p) not in head], "lr": config.lr},
              {"params": [p for p in params if id(p) in head], "lr": config.head_lr}]
    return [group for group in groups if group["params"]]


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
    # logging is not the mechanism; an unset head_lr is left out so that every run from before the setting
    # existed keeps its identity, and with it its randomness
    settings = {k: v for k, v in asdict(config).items()
                if k != "log_every" and not (k == "head_lr" and v is None)}
    if per_sample_gradients is not None:
        settings["per_sample_gradients"] = per_sample_gradients
    data = {} if data_sha256 is None else {"data_sha256": data_sha256, "num_examples": num_examples}
    return {"mechanism": "finetune", **identity, "pretrained_sha256": pretrained_sha256, **data,
            "settings": settings}


def per_sample_strategy(backbone: Backbone, config: FinetuneConfig) -> str:
    return backbone.per_sample_strategy if config.per_sample_gradients == "auto" else config.per_sample_gradients


def mechanism_identity(backbone: Backbone, config: FinetuneConfig, identity: dict,
                       train_features: tuple[torch.Tensor, ...], train_labels: torch.Tensor) -> dict:
    """The full identity (`finetune_identity`) of fine-tuning `backbone` on these training examples: what keys
    the run's randomness, and what tells a repeated release from a new one (privacy/release_log.py)."""
    data_sha256 = tensors_sha256({"labels": train_labels, **{f"x{i}": f for i, f in enumerate(train_features)}})
    return finetune_identity(config, identity, backbone.checkpoint_sha256, data_sha256=data_sha256,
                             num_examples=int(train_labels.shape[0]),
                             per_sample_gradients=per_sample_strategy(backbone, config))


@dataclass(frozen=True)
class SamplingPlan:
    """What the accountant is told before the run, from the settings and the data's size alone."""

    population: int  # N, or the public size under add/remove (never N there: it differs between neighbours)
    size_name: str  # "N" or "public_n", for messages
    sample_rate: float  # q = B / population
    steps: int  # round(epochs / q)
    delta: float  # 1 / population unless configured


def sampling_plan(config: FinetuneConfig, private: bool, num_examples: int) -> SamplingPlan:
    if config.batch_size > num_examples:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {num_examples} training examples")
    public_size = config.neighbouring == "add_remove" and config.public_n is not None
    population, size_name = (config.public_n, "public_n") if public_size else (num_examples, "N")
    # delta <= 1/N: a larger delta admits mechanisms that publish one whole example outright. The default is the
    # paper's 1/N; the tolerance lets a delta typed as 1/N's decimal expansion pass.
    if config.delta is not None and private and not 0 < config.delta <= (1.0 / population) * (1 + 1e-9):
        raise ValueError(f"finetune.delta must be in (0, 1/{size_name}] = (0, {1.0 / population:.6g}] for "
                         f"{size_name} = {population}, got {config.delta}")
    sample_rate = min(1.0, config.batch_size / population)
    return SamplingPlan(population, size_name, sample_rate, max(1, round(config.epochs / sample_rate)),
                        config.delta if config.delta is not None else 1.0 / population)


def task_model(backbone: Backbone, num_classes: int, head_only: bool, randomness, head: dict | None,
               train_head: bool) -> tuple[TaskModel, list[torch.nn.Parameter]]:
    """The model to train, its head from `head` or a keyed initialisation, and the top's parameters a head-only
    run froze (the shared backbone's flags, to restore when the run ends)."""
    with torch.random.fork_rng(devices=[]):  # the head's initial weights, without touching the caller's RNG
        torch.manual_seed(randomness.seed("head_init"))
        model = TaskModel(backbone, num_classes)
    if head is not None:
        model.head.load_state_dict(head)
    model.head.requires_grad_(train_head)
    frozen_top = [p for p in model.backbone_network.parameters() if p.requires_grad] if head_only else []
    for p in frozen_top:
        p.requires_grad_(False)
    model.train()
    return model, frozen_top


BACKBONE_PREFIX = "backbone_network."


def anchors_of(names: list[str], backbone: Backbone, pretrained: dict) -> list[torch.Tensor | None]:
    """w0 for every trained parameter (Eq. 7's anchor), None for those without a pretrained value (the head)."""
    internal = {name: value.to(backbone.device) for name, value in backbone.internal_state(pretrained).items()}
    return [internal.get(name.removeprefix(BACKBONE_PREFIX)) for name in names]


def noise_multiplier(config: FinetuneConfig, method, plan: SamplingPlan, steps: int) -> float:
    """sigma calibrated to the target for the method's queries per step; 0 where nothing private is queried."""
    if not (method.private and steps):
        return 0.0
    return calibrate_noise_multiplier(config.target_epsilon, plan.delta, plan.sample_rate, steps,
                                      method.queries_per_step, config.accountant, config.neighbouring)


class GradientOracle:
    """The loop's only way to the data: each call is one query on the step's batch; the private ones are counted,
    so that what the accountant is charged comes from what ran, not from the configuration (steps_by_queries[k] =
    how many steps made k privatized queries on their batch)."""

    def __init__(self, config: FinetuneConfig, private: bool, model: TaskModel, backbone: Backbone, params,
                 optimizer, per_sample, sigma: float, noise, canaries):
        self.config, self.private, self.model, self.backbone, self.params = config, private, model, backbone, params
        self.optimizer, self.per_sample, self.sigma, self.noise, self.canaries = (optimizer, per_sample, sigma,
                                                                                  noise, canaries)
        self.this_step = 0
        self.steps_by_queries: collections.Counter = collections.Counter()

    def __call__(self, features, labels):
        if not self.private:
            return self._nonprivate(features, labels)
        self.this_step += 1  # every privatized query; a non-private run is charged nothing
        return self._private(features, labels)

    def begin_step(self) -> None:
        self.this_step = 0
        if self.canaries is not None:
            self.canaries.begin_step()

    def end_step(self) -> None:
        self.steps_by_queries[self.this_step] += 1

    def _private(self, features, labels):
        return privatized_gradient(
            self.per_sample, features, labels, clip_norm=self.config.clip_norm, noise_multiplier=self.sigma,
            expected_batch_size=self.config.batch_size, noise=self.noise,
            extra_examples=self.canaries.add_to if self.canaries is not None else None,
        )

    def _nonprivate(self, features, labels):
        self.optimizer.zero_grad(set_to_none=True)
        if labels.numel():
            with self.backbone.autocast():
                loss = task_loss(self.model(*features), labels)
            loss.backward()
        gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.canaries is not None:  # as examples of the mean loss
            self.canaries.add_to(gradients, scale=1.0 / max(int(labels.numel()), 1))
        return gradients


def train(
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
    audit=None,
) -> TrainingResult:
    """Fine-tune the backbone's top and a head on one task; return the task vector and privacy record.

    `study_key` (privacy/study_key.py) and `identity` (at least the backbone's and the task's names, and the method's
    label) key every random draw: the same key and identity reproduce the run bit for bit, anyone without the
    key cannot replay it, and any other identity draws independent randomness.

    The head starts from `head` when given (a CLIP zero-shot head, computed from public weights) and is
    frozen with ``train_head=False``, as the paper does for CLIP; otherwise it is a fresh head trained with the
    top (and privatized with it: it is part of every clipped per-example gradient).

    With `checkpoint`, the run saves its full state there every `checkpoint_every` steps and, when started
    again, resumes from it (training/checkpoint.py). Steps lost after the last checkpoint released nothing and are
    recomputed identically, so no budget is spent twice. The caller removes the file once the outputs are
    released (a crash before that resumes from it again).

    `audit` (training/canaries.py: `WhiteBoxAudit`, `InputCanaries`) makes the run a privacy audit's: it may
    change the training set before anything is sampled and add canaries to every query; the result carries them.
    Such a run is never a release, and it is not checkpointed.
    """
    if audit is not None and checkpoint is not None:
        raise ValueError("an audit run is not checkpointed: its canaries' draws are not part of the saved state")
    if audit is not None:
        train_features, train_labels = audit.training_set(tuple(train_features), train_labels)
    run = prepare_run(backbone, num_classes, tuple(train_features), train_labels, config, study_key, identity,
                      head, train_head, audit)
    log_start(run, backbone, log)
    saved = Resumable(checkpoint, checkpoint_every, resume_fingerprint(run, backbone, study_key, checkpoint))
    first_step = saved.resume(run, backbone.device, log)
    if run.method.head_only and run.params:
        pooling_started = time.perf_counter()
        run.train_features = head_only_inputs(run.model, run.train_features, backbone)
        log(compute_line("w0's top on the training set", time.perf_counter() - pooling_started))
    try:
        losses = training_loop(run, backbone, first_step, saved, log)
    except BaseException:
        backbone.load_top_state(run.pretrained)  # the shared backbone must not keep a half-trained top
        raise
    finally:
        if run.per_sample is not None:
            run.per_sample.close()  # remove hooks: the backbone is shared with later models in this process
        for p in run.frozen_top:
            p.requires_grad_(True)
    return released(run, backbone, losses)


@dataclass
class PreparedRun:
    """One fine-tune as its loop runs it: settings, data, secret streams, what trains and how, fixed before the
    first step (`prepare_run`)."""

    config: FinetuneConfig
    method: object  # its row of dpmerge/methods.py
    plan: SamplingPlan
    train_features: tuple[torch.Tensor, ...]
    train_labels: torch.Tensor
    strategy: str  # the per-sample gradient strategy
    mechanism: dict  # the full identity every random draw is keyed by
    sampler: object
    noise: object
    pretrained: dict[str, torch.Tensor]
    model: TaskModel
    frozen_top: list
    names: list[str]
    params: list[torch.Tensor]
    steps: int
    per_sample: object
    anchors: list
    optimizer: object
    canaries: object
    sigma: float
    query: object  # GradientOracle
    head: dict | None  # the head the run started from (given), for the checkpoint's fingerprint
    train_head: bool

    @property
    def num_examples(self) -> int:
        return int(self.train_labels.shape[0])


def prepare_run(backbone: Backbone, num_classes: int, train_features: tuple[torch.Tensor, ...],
                train_labels: torch.Tensor, config: FinetuneConfig, study_key: bytes, identity: dict,
                head: dict | None, train_head: bool, audit) -> PreparedRun:
    """The mechanism's identity and its secret randomness, then what trains, the optimizer, the clipper and
    sigma."""
    method = METHODS[config.method]
    plan = sampling_plan(config, method.private, int(train_labels.shape[0]))
    strategy = per_sample_strategy(backbone, config)
    mechanism = mechanism_identity(backbone, config, identity, train_features, train_labels)
    randomness = MechanismRandomness(study_key, mechanism, config.rng)
    sampler = randomness.stream("poisson_sampler", "cpu")
    noise = randomness.stream("gaussian_noise", backbone.device)  # drawn where the gradients are (same on resume)
    pretrained = backbone.top_state()
    model, frozen_top = task_model(backbone, num_classes, method.head_only, randomness, head, train_head)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    # Nothing to train (a head-only run with a frozen zero-shot head): no query touches the data, none is
    # accounted, and the release is w0 with the public head.
    steps = plan.steps if params else 0
    per_sample = make_clipper(model, strategy, backbone.autocast) if method.private and params else None
    optimizer = adamw(parameter_groups(model, params, config), lr=config.lr, weight_decay=config.weight_decay,
                      betas=config.betas) if params else None
    canaries = None if audit is None else audit.gradient_canaries(
        released_shapes={name: value.shape for name, value in pretrained.items()}, clip_norm=config.clip_norm,
        sample_rate=plan.sample_rate, randomness=randomness, to_internal=backbone.internal_state,
        internal_names=[n.removeprefix(BACKBONE_PREFIX) if n.startswith(BACKBONE_PREFIX) else None for n in names])
    sigma = noise_multiplier(config, method, plan, steps)
    query = GradientOracle(config, method.private, model, backbone, params, optimizer, per_sample, sigma, noise,
                           canaries)
    return PreparedRun(config, method, plan, train_features, train_labels, strategy, mechanism, sampler, noise,
                       pretrained, model, frozen_top, names, params, steps, per_sample,
                       anchors_of(names, backbone, pretrained), optimizer, canaries, sigma, query, head, train_head)


def log_start(run: PreparedRun, backbone: Backbone, log) -> None:
    config, plan = run.config, run.plan
    log(
        f"[finetune] method={config.method} {plan.size_name}={plan.population} q={plan.sample_rate:.5f} "
        f"steps={run.steps} sigma={run.sigma:.4f} queries/step={run.method.queries_per_step} delta={plan.delta:.3g}"
        + (f" neighbouring={config.neighbouring} randomness={config.rng} per-sample={run.strategy}"
           if run.method.private else "")
        + f" device={backbone.device} precision={backbone.precision} "
        f"pretrained_sha256={backbone.checkpoint_sha256[:16]}..."
    )


def resume_fingerprint(run: PreparedRun, backbone: Backbone, study_key: bytes, checkpoint) -> str | None:
    """What a checkpoint must have been saved by to be resumed: this mechanism, key, data, weights and settings."""
    if checkpoint is None:
        return None
    return run_fingerprint(
        run.config, study_key, run.mechanism, (run.sampler, run.noise), num_examples=run.num_examples,
        data_sha256=run.mechanism["data_sha256"], pretrained_sha256=backbone.checkpoint_sha256, parameters=run.names,
        sigma=run.sigma, strategy=run.strategy, precision=backbone.precision, train_head=run.train_head,
        head=run.head)


@dataclass
class Resumable:
    """Where a run keeps its state (None: nowhere), how often, and the fingerprint a saved state must carry."""

    checkpoint: str | Path | None
    every: int
    fingerprint: str | None
    memory: dict = field(default_factory=dict)  # what a step function keeps for the next step (method_update)

    def resume(self, run: PreparedRun, device, log) -> int:
        """The first step to run: 0, or the step a checkpoint of this very run was saved at (its state restored)."""
        if self.checkpoint is None:
            return 0
        self.checkpoint = Path(self.checkpoint)
        first_step = resume(self.checkpoint, self.fingerprint, run.params, run.optimizer, run.sampler, run.noise,
                            self.memory, run.query.steps_by_queries, device, log)
        if first_step:
            log(f"[finetune] resumed from {self.checkpoint} at step {first_step}/{run.steps}")
        return first_step

    def after(self, run: PreparedRun, step: int) -> None:
        if self.checkpoint is not None and (step + 1) % self.every == 0 and step + 1 < run.steps:
            save_checkpoint(self.checkpoint, self.fingerprint, step + 1, run.query.steps_by_queries, run.params,
                            run.optimizer, run.sampler, run.noise, self.memory)


def training_loop(run: PreparedRun, backbone: Backbone, first_step: int, saved: Resumable, log) -> list[float]:
    """The steps from `first_step`: a Poisson batch, the method's privatized update, AdamW; checkpoints and
    progress lines. Returns the non-private training losses (a private run's loss is a statistic nothing
    privatized, so none is kept)."""
    config, device = run.config, backbone.device
    hyperparameters = {name: getattr(config, name) for name in run.method.hyperparameters}
    losses: list[float] = []
    started, loop_started = time.time(), time.perf_counter()
    for step in range(first_step, run.steps):
        batch = poisson_batch(run.num_examples, run.plan.sample_rate, run.sampler)
        run.query.begin_step()
        features = tuple(f[batch].to(device, non_blocking=True) for f in run.train_features)
        labels = run.train_labels[batch].to(device)
        update = method_update(run.method, run.query, run.params, run.anchors, features, labels, saved.memory,
                               **hyperparameters)
        run.query.end_step()
        for p, u in zip(run.params, update):
            p.grad = u
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        saved.after(run, step)
        if step % config.log_every == 0 or step == run.steps - 1:
            log_progress(log, step, first_step, run.steps, started, run.method.private, run.model, backbone, features,
                         labels, losses)
    log(compute_line("training loop", time.perf_counter() - loop_started))
    return losses


def released(run: PreparedRun, backbone: Backbone, losses: list[float]) -> TrainingResult:
    """The release: epsilon spent by the steps that ran (refused above the target), the task vector, the head and
    the record; the shared backbone left as it was found."""
    config, method, pretrained = run.config, run.method, run.pretrained
    ran = {int(k): int(n) for k, n in sorted(run.query.steps_by_queries.items()) if k > 0}
    spent = NONPRIVATE_RECORDED
    if method.private:
        spent = spent_epsilon_of_steps(run.sigma, run.plan.sample_rate, ran, run.plan.delta, config.accountant,
                                       config.neighbouring)
        if spent > config.target_epsilon:
            backbone.load_top_state(pretrained)
            raise RuntimeError(
                f"refusing to release: the {sum(ran.values())} steps that ran made {dict(ran)} (queries per step: "
                f"steps), which spends epsilon {spent:.4f} > target {config.target_epsilon}"
            )
    finetuned = backbone.top_state()
    task_vector = {name: finetuned[name] - pretrained[name] for name in pretrained}
    head = {name: value.detach().to("cpu", copy=True) for name, value in run.model.head.state_dict().items()}
    backbone.load_top_state(pretrained)  # leave the shared backbone as we found it
    record = release_record(run, spent, ran, backbone)
    return TrainingResult(task_vector, head, record, losses, run.canaries)


def log_progress(log, step: int, first_step: int, steps: int, started: float, private: bool, model, backbone,
                 features, labels, losses: list[float]) -> None:
    """A step's progress line with its rate and ETA. A private run's shows progress only: its loss and real batch
    size are statistics of the private data that nothing privatized, and logs get copied with results."""
    elapsed = time.time() - started
    rate = (step + 1 - first_step) / elapsed if elapsed > 0 else float("inf")
    observed = ""
    if not private:
        with torch.no_grad(), backbone.autocast():
            loss = task_loss(model(*features), labels).item() if labels.numel() else float("nan")
        losses.append(loss)
        observed = f" batch={labels.numel()} loss={loss:.4f}"
    log(f"[finetune] step {step + 1}/{steps}{observed} "
        f"elapsed={elapsed:.1f}s ({rate:.2f} steps/s, eta {(steps - step - 1) / rate:.0f}s)")


def release_record(run: PreparedRun, spent, ran: dict[int, int], backbone: Backbone) -> dict:
    """The release's privacy record: everything the ledger recomputes epsilon from, from what ran."""
    config, method, plan, sigma = run.config, run.method, run.plan, run.sigma
    steps_by_queries, pretrained, num_examples = run.query.steps_by_queries, run.pretrained, run.num_examples
    strategy, train_head = run.strategy, run.train_head
    return {
        "method": config.method,
        "target_epsilon": config.target_epsilon if method.private else NONPRIVATE_RECORDED,
        "spent_epsilon": spent,
        "delta": plan.delta if method.private else 0.0,
        "noise_multiplier": sigma,
        "effective_noise_multiplier": effective_noise_multiplier(sigma, method.queries_per_step),
        "sample_rate": plan.sample_rate,
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
