"""Everything before fine-tuning. Rules: pretrained (w0 of the mergeable parameters), prepare (a task's cached
trunk features), zeroshot_head (a CLIP task's frozen head); by hand: prepare_data (download a paper dataset)
and make_standins (tiny stand-in checkpoints and datasets).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from dpmerge.artifacts import load_prepared, save_prepared, save_tensors, tensors_sha256
from dpmerge.config_sampling import check_limits
from dpmerge.data.loading import load_task
from dpmerge.data.paper import download
from dpmerge.data.registry import GLUE_TASKS, VISION_TASKS
from dpmerge.data.standins import standin_tokenizer_corpus, write_standin
from dpmerge.models.spec import backbone_from_spec, weights_spec
from dpmerge.models.standins import write_tiny_clip, write_tiny_roberta
from dpmerge.models.zeroshot_prompts import TEMPLATES
from dpmerge.runtime import compute_section
from dpmerge.stages.common import log


def prepare(*, backbone: str, backbone_spec: dict, task: str, out: str, max_train: int | None = None,
            max_test: int | None = None, data_seed: int = 0, data_dir: str | None = None, workers: int = 1,
            validation_fraction: float | None = None, own_task: dict | None = None,
            sampling_limits: dict | None = None) -> None:
    """Load a task, run the frozen trunk once over it, save features and labels (artifacts.save_prepared).
    `own_task`: the config's entry of a researcher's own task (data/own.py), read from its files.
    With `validation_fraction` the evaluation split is held out of the training subset (data.loading).
    `max_train`, `max_test`: caps on the seeded subsets (None or 0: no cap). `sampling_limits`
    (config_sampling.sampling_limits): the task's largest batch size and delta, refused against the N read here,
    before any of its fine-tunes runs and before the trunk's work."""
    network = backbone_from_spec(backbone_spec)
    started = time.time()
    data = load_task(
        task, image_size=int(backbone_spec.get("image_size", 64)), max_train=max_train or None,
        max_test=max_test or None,
        seed=data_seed, data_dir=data_dir, workers=workers, validation_fraction=validation_fraction, own=own_task,
    )
    if data.spec.modality != network.modality:
        raise ValueError(f"task {task!r} is a {data.spec.modality} task but backbone {backbone!r} is a "
                         f"{network.modality} backbone")
    if sampling_limits is not None:
        check_limits(sampling_limits, len(data.train_labels))
    evaluated_on = "test" if validation_fraction is None else "validation"
    log(f"[prepare] {task}: {len(data.train_labels)} train / {len(data.test_labels)} {evaluated_on} examples")
    with compute_section("trunk features", log):
        train = network.trunk_features(data.train_inputs, log=log)
        test = network.trunk_features(data.test_inputs)
    save_prepared(
        out, task=task, backbone=backbone, task_spec=asdict(data.spec), class_names=data.class_names,
        train_features=train, train_labels=data.train_labels, test_features=test, test_labels=data.test_labels,
        pretrained_sha256=network.checkpoint_sha256,
    )
    log(f"[prepare] wrote {out} in {time.time() - started:.1f}s")


def pretrained(*, backbone: str, backbone_spec: dict, out: str) -> None:
    """Save w0 restricted to the trainable (mergeable) parameters, with its content hash (`w0_sha256`, the one
    every fine-tune of this backbone records) beside the checkpoint's."""
    network = backbone_from_spec(backbone_spec)
    top = network.top_state()
    save_tensors(
        out, top,
        {"backbone": backbone, "spec": weights_spec(backbone_spec), "pretrained_sha256": network.checkpoint_sha256,
         "w0_sha256": tensors_sha256(top)},
    )
    log(f"[pretrained] wrote {out} ({len(network.trainable_names())} tensors)")


def zeroshot_head(*, backbone: str, backbone_spec: dict, data: str, out: str) -> None:
    """A CLIP zero-shot classification head for one task from the text encoder, class names and prompts."""
    network = backbone_from_spec(backbone_spec)
    if not hasattr(network, "zeroshot_head"):
        raise ValueError(f"backbone {backbone!r} has no text encoder for zero-shot heads")
    prepared = load_prepared(data)
    task = prepared["task"]
    # The paper's tasks use task_vectors' prompts; any other task the generic CLIP prompt.
    templates = TEMPLATES.get(task, [lambda c: f"a photo of a {c}."])
    head = network.zeroshot_head(list(prepared["class_names"]), templates)
    save_tensors(out, head, {
        "artifact": "zeroshot_head", "backbone": backbone, "task": task,
        "pretrained_sha256": network.checkpoint_sha256, "class_names": list(prepared["class_names"]),
        "templates": [template("{}") for template in templates],
        # computed from public weights and public class names: no private data, no privacy cost
        "privacy": "public",
    })
    log(f"[zeroshot-head] {task}: {len(prepared['class_names'])} classes x {len(templates)} prompts -> {out}")


def prepare_data(*, task: str, data_dir: str) -> None:
    """Download one paper dataset into the data directory (online machines only)."""
    try:
        path = download(task, data_dir)
    except RuntimeError as error:  # offline, or a source that needs a manual copy
        raise ValueError(str(error)) from None
    log(f"[prepare-data] {task} is in {path}")


def make_standins(*, out: str, vision_classes: int = 3, train_per_class: int = 24, test_per_class: int = 8,
                  image_size: int = 40, seed: int = 0) -> None:
    """Tiny CLIP and RoBERTa checkpoints and tiny copies of the paper's datasets, in the real formats."""
    out = Path(out)
    config, checkpoint = write_tiny_clip(out / "clip", seed=seed)
    log(f"[make-standins] tiny CLIP: {config}, {checkpoint}")
    for task in VISION_TASKS:
        write_standin(task, out / "data", num_classes=vision_classes, train_per_class=train_per_class,
                      test_per_class=test_per_class, image_size=image_size, seed=seed)
    for task in GLUE_TASKS:
        write_standin(task, out / "data", train_per_class=train_per_class, test_per_class=test_per_class, seed=seed)
    write_tiny_roberta(out / "roberta", standin_tokenizer_corpus(), seed=seed)
    log(f"[make-standins] tiny RoBERTa: {out / 'roberta'}; datasets: {out / 'data'}")
