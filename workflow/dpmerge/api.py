"""dpmerge from Python, for a notebook: privately fine-tune your own torch module on your own data to a target
epsilon and get its task vector, head and privacy record, by the pipeline's own mechanism and accountant; merge
task vectors with any operator; score a model with a task vector and a head. docs/python-api.md walks through it.

    release = private_finetune(encoder, features, labels, task="xrays", epsilon=4.0, study_key="study.key")
    merged = merge([release, other], operator="ties")
    evaluate(encoder, merged, release.head, test_features, test_labels)

`encoder` maps a batch of your inputs to embeddings (B, D); its parameters that require grad are fine-tuned and
form the task vector (freeze the rest with requires_grad_(False)); a linear head on D is trained with them and
privatized with them. The encoder is left at its pretrained weights w0 after every call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import dpmerge.merge.registry
from dpmerge.artifacts import save_released, tensors_sha256
from dpmerge.merge.registry import is_personalized
from dpmerge.metrics import METRICS
from dpmerge.models.base import Backbone, task_model_weights
from dpmerge.models.evaluation import evaluate_head
from dpmerge.privacy.release import check_release_group, merged_release_budget
from dpmerge.privacy.release_log import ReleaseLogError, check_replacement, publish, release_log_path
from dpmerge.privacy.study_key import StudyKeyError, load_or_create_key, mechanism_fingerprint
from dpmerge.training.finetune import FinetuneConfig, mechanism_identity, train

TaskVector = dict[str, torch.Tensor]
# FinetuneConfig's fields a caller may set by keyword (method and epsilon have their own arguments)
SETTINGS = tuple(f.name for f in dataclasses.fields(FinetuneConfig) if f.name not in ("method", "target_epsilon"))


@dataclass(frozen=True)
class Release:
    """What a private fine-tune releases: the task vector tau = w - w0 (the encoder's fine-tuned parameters, by
    name), the head, and the privacy record every release carries (epsilon spent, delta, sigma, q, steps, C,
    queries per step, accountant, seed, the pretrained weights' hash, ...). All three are public."""

    task: str
    task_vector: TaskVector
    head: dict[str, torch.Tensor]
    record: dict
    # private bookkeeping, never saved: the release log beside the study key the run drew from, and the run's
    # keyed mechanism tag (privacy/release_log.py)
    release_log: Path | None = field(default=None, repr=False, compare=False)
    mechanism: str | None = field(default=None, repr=False, compare=False)

    @property
    def epsilon(self) -> float:
        return float(self.record["spent_epsilon"])

    def save(self, task_vector_path: str | Path, head_path: str | Path, *, replace: bool = False) -> None:
        """The task vector and head as safetensors files with the record in their metadata, as `dpmerge finetune`
        writes them: `dpmerge merge` and `dpmerge ledger` read them. A release from `private_finetune` is logged
        first in the release log beside its study key, as the pipeline's are: a file once written may be
        published, so it counts in its dataset's budget for good. Saving another run's release where the log holds
        one is refused unless `replace` (the earlier release stays in the log)."""
        identity = {"backbone": self.record.get("backbone", "module"), "task": self.task}
        files = [(head_path, self.head, "head"), (task_vector_path, self.task_vector, "task_vector")]
        if self.release_log is None:  # a Release built by hand: no run, no log
            for path, tensors, artifact in files:
                save_released(path, tensors, self.record, {**identity, "artifact": artifact})
            return
        try:
            check_replacement(self.release_log, [task_vector_path, head_path], self.mechanism, allowed=replace)
        except ReleaseLogError as error:
            raise ValueError(str(error).replace("privacy: {replace_releases: true} (or pass --replace-release)",
                                                "save(..., replace=True)")) from None
        publish(self.release_log, mechanism=self.mechanism, record=self.record, where=identity, files=files)


class ModuleBackbone(Backbone):
    """Your `encoder` as a backbone: no frozen trunk (your features go straight in), the encoder as the top."""

    kind = "module"
    modality = "module"

    def __init__(self, encoder: nn.Module, example: tuple[torch.Tensor, ...], name: str):
        refuse_batch_norm(encoder)
        self.network = encoder
        self.name = name
        if not self.network_trainable_names():
            raise ValueError("the encoder has no parameter that requires grad: nothing to fine-tune")
        was_training = encoder.training
        encoder.eval()
        with torch.no_grad():
            embedding = encoder(*(t[:1] for t in example))
        encoder.train(was_training)
        if embedding.dim() != 2:
            raise ValueError(f"the encoder must map a batch to embeddings of shape (batch, width); it gave "
                             f"{tuple(embedding.shape)}")
        self.embed_dim = int(embedding.shape[1])
        self.checkpoint_path = Path(f"<{name} in memory>")
        # What the record calls the pretrained weights: the content hash of w0 (no checkpoint file here)
        self.checkpoint_sha256 = tensors_sha256(self.top_state())

    def encode_inputs(self, inputs):
        return tuple(inputs) if isinstance(inputs, tuple) else (inputs,)

    def trunk(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return inputs

    def top(self, *features: torch.Tensor) -> torch.Tensor:
        return self.network(*features)


def refuse_batch_norm(encoder: nn.Module) -> None:
    """Batch normalisation mixes the examples of a batch, so one example's gradient is not its own and clipping
    it bounds nothing; refused with the way out (Opacus's ModuleValidator refuses it too)."""
    for name, module in encoder.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(f"encoder layer {name!r} is {type(module).__name__}: batch statistics mix examples, "
                             "so per-example gradients are not per example and DP does not hold; replace it with "
                             "GroupNorm or LayerNorm (e.g. opacus.validators.ModuleValidator.fix(encoder))")


def _features(features) -> tuple[torch.Tensor, ...]:
    features = tuple(features) if isinstance(features, (tuple, list)) else (features,)
    if not features or not all(isinstance(f, torch.Tensor) for f in features):
        raise ValueError("features must be a tensor (or a tuple of tensors) with one row per example")
    if len({int(f.shape[0]) for f in features}) != 1:
        raise ValueError(f"features disagree on the number of examples: {[int(f.shape[0]) for f in features]}")
    return features


def _labels(labels, count: int) -> torch.Tensor:
    labels = torch.as_tensor(labels)
    if labels.dim() != 1 or int(labels.shape[0]) != count:
        raise ValueError(f"labels must be one value per example ({count}), got shape {tuple(labels.shape)}")
    if labels.is_floating_point():
        return labels.float()  # a regression target: one output, mean squared error
    if int(labels.min()) < 0:
        raise ValueError("class labels must be integers 0, 1, ..., num_classes - 1")
    return labels.long()


def private_finetune(encoder: nn.Module, features, labels, *, task: str, epsilon: float | None,
                     study_key: str | Path, method: str = "dp_merging", num_classes: int | None = None,
                     name: str = "module", log=print, **settings) -> Release:
    """Fine-tune `encoder` and a fresh linear head on one task's (`features`, `labels`) with `method`
    (dp_merging: DP-SAM plus the anchor to w0; naive_dp: DP-SGD; nonprivate with `epsilon` None; any name in
    dpmerge.methods) to the target `epsilon` at delta = 1/N unless `delta` is given, and return its Release.

    The mechanism is the pipeline's: Poisson batches of expected size `batch_size`, per-example clipping to
    `clip_norm`, Gaussian noise calibrated to epsilon by the accountant (exact PLD under replace-one neighbours
    by default), two gradient queries per DP-SAM step accounted as one. Every random draw comes from the secret
    `study_key` (a file, created with mode 0600 if missing) keyed by `name`, `task`, the method and the data, so
    other tasks draw independent randomness. `settings` are FinetuneConfig's fields: epochs, batch_size,
    clip_norm, lr, weight_decay, betas, rho, anchor_lambda, delta, accountant, neighbouring, public_n, rng,
    seed, per_sample_gradients. Labels are class indices (num_classes inferred as the largest + 1) or floats (a
    regression task).
    """
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; private_finetune takes {', '.join(SETTINGS)}")
    features = _features(features)
    labels = _labels(labels, int(features[0].shape[0]))
    if num_classes is None:
        num_classes = 1 if labels.is_floating_point() else int(labels.max()) + 1
    config = FinetuneConfig(method=method, target_epsilon=epsilon, **settings)
    try:
        key = load_or_create_key(study_key)
    except StudyKeyError as error:
        raise ValueError(f"study_key: {error}") from None
    backbone = ModuleBackbone(encoder, features, name)
    w0 = backbone.top_state()
    was_training = encoder.training
    identity = {"backbone": name, "task": task, "method": method,
                "backbone_settings": {"module": type(encoder).__name__}}
    mechanism = mechanism_fingerprint(key, mechanism_identity(backbone, config, identity, features, labels))
    try:
        result = train(backbone, num_classes, features, labels, config, study_key=key, identity=identity,
                       log=log or (lambda message: None))
    finally:
        backbone.load_top_state(w0)  # the next task starts from the same w0
        encoder.train(was_training)
    return Release(task, result.task_vector, result.head, {**result.record, "task": task, "backbone": name},
                   release_log=release_log_path(study_key), mechanism=mechanism)


def merge(task_vectors: list, operator: str = "task_arithmetic", **hyperparameters) -> TaskVector:
    """One merged task vector from several (Releases or name -> tensor mappings) by `operator` (any name in
    `dpmerge merge --help`, with its hyperparameters by keyword; those not given take their defaults). Merging
    releases is post-processing: it spends no privacy (`merged_budget` says at what the merged model is released).
    Operators that read data statistics (regmean, fisher) are reached through dpmerge.merge.registry."""
    if is_personalized(operator):
        raise ValueError(f"{operator} keeps per-task parts beside a shared model (one model per task), not one "
                         "merged vector: use dpmerge.merge.registry.merge_stream")
    vectors = [v.task_vector if isinstance(v, Release) else v for v in task_vectors]
    return dpmerge.merge.registry.merge(operator, vectors, **hyperparameters)  # the package's merge, by its full name


def merged_budget(releases: list[Release]) -> tuple:
    """(epsilon, delta) a model merged from `releases` is released at, by parallel composition the largest of
    theirs: this holds when each task's training data is disjoint from the others' (as the pipeline's tasks are);
    releases of one dataset compose instead. Refused unless they are one release group (method, budget, w0)."""
    records = [release.record for release in releases]
    check_release_group(records)
    return merged_release_budget(records)


def evaluate(encoder: nn.Module, task_vector: TaskVector | Release | None, head: dict[str, torch.Tensor], features,
             labels, metric: str = "accuracy") -> dict:
    """Loss and score (0-100, by `metric`: one of dpmerge.metrics.METRICS) of the encoder at w0 + `task_vector`
    (None: w0 itself) with `head` on (`features`, `labels`). The encoder is left at w0."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if isinstance(task_vector, Release):
        task_vector = task_vector.task_vector
    features = _features(features)
    labels = _labels(labels, int(features[0].shape[0]))
    backbone = ModuleBackbone(encoder, features, "module")
    w0 = backbone.top_state()
    was_training = encoder.training
    try:
        if task_vector is not None:
            backbone.load_top_state(task_model_weights(w0, task_vector))
        return evaluate_head(backbone, head, features, labels, metric)
    finally:
        backbone.load_top_state(w0)
        encoder.train(was_training)
