"""Private fine-tuning of one task. Rule: finetune (one run per backbone, task, method, budget and seed); it
releases the task vector and head, each with the run's privacy record.
"""

from __future__ import annotations

from pathlib import Path

from dpmerge.artifacts import load_prepared, load_tensors
from dpmerge.methods import parse_label
from dpmerge.models.registry import BACKBONES
from dpmerge.models.spec import backbone_from_spec
from dpmerge.privacy.release_log import (
    backbone_settings,
    check_replacement,
    publish,
    release_log_path,
    run_settings,
)
from dpmerge.privacy.study_key import StudyKeyError, load_or_create_key, mechanism_fingerprint
from dpmerge.stages.common import log
from dpmerge.training.finetune import FinetuneConfig, mechanism_identity, train


def finetune(*, backbone: str, backbone_spec: dict, data: str, method: str, hparams: dict,
             epsilon: float | None, seed: int, study_key: str, out_vector: str, out_head: str,
             checkpoint: str | None = None, checkpoint_every: int = 10, zeroshot_head: str | None = None,
             replace_release: bool = False) -> None:
    """Fine-tune the task in `data` with `method`, a method's name or a sweep's label ('dp_merging-rho0.1',
    recorded in the release; the value it names must be the one `hparams` gives), and write its task vector and
    head, logged first in the study's release log (privacy/release_log.py).

    A backbone that classifies with frozen zero-shot heads needs `zeroshot_head`; other backbones train a fresh
    head. `checkpoint` is a resumable state file, removed when the run is done. Where the log holds another run's
    release at the output paths, the run is refused before it trains, unless `replace_release`.
    """
    method_label = method
    try:
        method, swept = parse_label(method_label)
    except ValueError as error:
        raise ValueError(f"--method: {error}") from None
    for parameter, value in swept.items():
        # A sweep's label and the settings it ran with must agree, or its tables would file it under a wrong value
        if parameter not in hparams or float(hparams[parameter]) != value:
            raise ValueError(f"--method {method_label} says {parameter} = {value:g}, but --hparams gives "
                             f"{hparams.get(parameter, 'no value')}")
    prepared, network, config, head, key = training_inputs(
        backbone_spec=backbone_spec, data=data, method=method, hparams=hparams, epsilon=epsilon, seed=seed,
        study_key=study_key, zeroshot_head=zeroshot_head)
    features, labels = tuple(prepared["train_features"]), prepared["train_labels"]
    identity = {"backbone": backbone, "task": prepared["task"], "method": method_label,
                "backbone_settings": backbone_settings(backbone_spec)}
    release_log = release_log_path(study_key)
    mechanism = mechanism_fingerprint(key, mechanism_identity(network, config, identity, features, labels))
    check_replacement(release_log, [out_vector, out_head], mechanism, allowed=replace_release)
    result = train(network, prepared["task_spec"]["num_classes"], features, labels, config, study_key=key,
                   identity=identity, log=log, checkpoint=checkpoint, checkpoint_every=checkpoint_every, head=head,
                   train_head=head is None)
    # Training losses are statistics of private data: they stay in the job log, never in a released file.
    publish(release_log, mechanism=mechanism, record=result.record,
            where={"backbone": backbone, "task": prepared["task"]},
            files=[(out_head, result.head, "head"), (out_vector, result.task_vector, "task_vector")],
            settings=run_settings(method=method_label, epsilon=epsilon, seed=seed, hparams=hparams,
                                  backbone_settings=backbone_settings(backbone_spec)))
    if checkpoint:
        Path(checkpoint).unlink(missing_ok=True)
    log(f"[finetune] released {out_vector} (spent epsilon {result.record['spent_epsilon']})")


def training_inputs(*, backbone_spec: dict, data: str, method: str, hparams: dict, epsilon: float | None, seed: int,
                    study_key: str, zeroshot_head: str | None = None):
    """What a training run needs, each checked against the others: the prepared task, the backbone that prepared
    it, the run's settings, the frozen zero-shot head (when the backbone classifies with one) and the study key.
    Shared by the releases' fine-tunes and the audits' runs (stages/audit.py)."""
    prepared = load_prepared(data)
    lacking = [key for key in ("train_features", "train_labels", "pretrained_sha256") if key not in prepared]
    if lacking:
        raise ValueError(f"{data}: a prepared task without {', '.join(lacking)}: not one 'dpmerge prepare' wrote "
                         "for training; prepare it again")
    network = backbone_from_spec(backbone_spec)
    if prepared["pretrained_sha256"] != network.checkpoint_sha256:
        raise ValueError(f"{data} was prepared from different pretrained weights; rerun prepare")
    try:
        config = FinetuneConfig(method=method, target_epsilon=epsilon, seed=seed, **hparams)
    except TypeError as error:
        raise ValueError(f"bad fine-tuning hyperparameters {sorted(hparams)}: {error}") from None
    head = None
    if zeroshot_head:
        head, head_meta = load_tensors(zeroshot_head)
        if head_meta.get("pretrained_sha256") != network.checkpoint_sha256 or head_meta.get("task") != prepared["task"]:
            raise ValueError(f"{zeroshot_head} is the zero-shot head of {head_meta.get('task')!r} from other "
                             "pretrained weights or another task; rerun zeroshot-head")
    elif BACKBONES[backbone_spec["kind"]].zeroshot_heads:
        raise ValueError(f"backbone {backbone_spec['kind']!r} classifies with frozen zero-shot heads: pass "
                         "--zeroshot-head (from 'dpmerge zeroshot-head')")
    try:
        key = load_or_create_key(study_key)
    except StudyKeyError as error:
        raise ValueError(f"--study-key: {error}") from None
    return prepared, network, config, head, key
