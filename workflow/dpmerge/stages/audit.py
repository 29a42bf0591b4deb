"""Empirical privacy audits of the fine-tuning mechanisms (privacy/audit.py). Command: `dpmerge audit`.

An audit run is the release's mechanism (the same method, settings, budget and data) run once more with m
canaries (training/canaries.py) under its own identity, so its randomness is independent of every release's:
`white_box` Dirac gradients in the DP step, scored on the task vector; or `black_box` mislabeled held-out
examples in the training set, scored by the trained model's loss on them. Its task vector is never released; what is published is the lower bound epsilon_lb from the
canaries' scores, beside the epsilon the accountant gives the run's own record at the audit's delta.

Privacy of the published bound: the audit run reads the task's private training data, so it is one more
(epsilon, delta) mechanism on that task. The bound is a function of its task vector and the secret coins
(which are independent of the data): post-processing of a run within that budget. The audit's row carries the
run's full privacy record so that the task's composition can count it.
"""

from __future__ import annotations

import json
import time

from dpmerge.epsilon import epsilon_column_value
from dpmerge.stages.common import log, write_parquet

AUDIT_DELTA = 1e-5  # the delta the bound is stated at: its 2 m delta term must be small beside 1
AUDIT_KINDS = ("white_box", "black_box")


def audit(*, backbone: str, backbone_spec: dict, data: str, method: str, hparams: dict, epsilon: float | None,
          seed: int, study_key: str, out: str, canaries: int = 1000, audit_delta: float = AUDIT_DELTA,
          confidence: float = 0.95, zeroshot_head: str | None = None, kind: str = "white_box") -> dict:
    """Run `method` on the task in `data` with `canaries` canaries of `kind` and write one Parquet row: epsilon_lb
    at `audit_delta` and `confidence`, the accountant's epsilon for the run at that delta, and the verdict (FAIL
    when the bound exceeds the claim). Returns the row."""
    from dpmerge.privacy.accounting import composed_epsilon, record_mechanisms
    from dpmerge.privacy.audit import audit_scores
    from dpmerge.privacy.randomness import MechanismRandomness
    from dpmerge.stages.finetune import training_inputs
    from dpmerge.training.finetune import finetune as train

    if kind not in AUDIT_KINDS:
        raise ValueError(f"--kind must be one of {', '.join(AUDIT_KINDS)}, got {kind!r}")
    if canaries < 2:
        raise ValueError(f"--canaries must be at least 2, got {canaries}")
    if not 0 < audit_delta or 2 * canaries * audit_delta > 0.1:
        raise ValueError(f"--audit-delta {audit_delta} with {canaries} canaries: the bound's 2 m delta term "
                         f"({2 * canaries * audit_delta:.3g}) must stay below 0.1, or the audit has no power; "
                         f"use a delta of at most {0.05 / canaries:.2g}")
    prepared, network, config, head, key = training_inputs(
        backbone_spec=backbone_spec, data=data, method=method, hparams=hparams, epsilon=epsilon, seed=seed,
        study_key=study_key, zeroshot_head=zeroshot_head)
    identity = {"backbone": backbone, "task": prepared["task"], "method": method,
                "audit": {"kind": kind, "canaries": canaries}}
    num_classes = prepared["task_spec"]["num_classes"]
    inputs = None
    if kind == "black_box":
        inputs = held_out_canaries(prepared, canaries, num_classes, MechanismRandomness(key, identity, config.rng))
    started = time.perf_counter()
    result = train(network, num_classes, tuple(prepared["train_features"]), prepared["train_labels"], config,
                   study_key=key, identity=identity, log=log, head=head, train_head=head is None,
                   audit_canaries=canaries if kind == "white_box" else 0, input_canaries=inputs)
    trained = time.perf_counter() - started
    record = result.record
    if kind == "white_box":
        scores, included = result.canaries.scores(result.task_vector), result.canaries.included
    else:
        scores, included = inputs.scores(trained_model_loss(network, result)), inputs.included
    bound = audit_scores(scores.numpy(), included.numpy(), audit_delta, confidence)
    private = record["accountant"] is not None
    # The claim at the audit's delta, from what the run's record says ran (sigma, q, steps by queries), never
    # from the configuration.
    claimed = (composed_epsilon(record_mechanisms(record), audit_delta, record["accountant"]) if private
               else float("inf"))
    row = {
        "backbone": backbone, "task": prepared["task"], "method": method,
        "target_epsilon": epsilon_column_value(record["target_epsilon"]), "seed": seed, "audit": kind, **bound,
        "audit_delta": audit_delta,
        "claimed_epsilon_at_audit_delta": claimed, "verdict": "FAIL" if bound["epsilon_lb"] > claimed else "PASS",
        "training_seconds": trained, "privacy_record": json.dumps(record, sort_keys=True, default=str),
    }
    write_parquet([row], out)
    log(f"[audit] {backbone}/{prepared['task']}/{method}: epsilon_lb {bound['epsilon_lb']:.3f} at delta "
        f"{audit_delta:g} ({bound['correct']}/{bound['guesses']} guesses right, {canaries} canaries), claimed "
        f"{claimed:.3f}: {row['verdict']}")
    return row


def held_out_canaries(prepared: dict, count: int, num_classes: int, randomness):
    """`count` test examples of the task, a keyed random subset, as black-box canaries (never in the training
    split, so a canary is in the audit run's training set exactly when its coin says so)."""
    import torch

    from dpmerge.training.canaries import InputCanaries

    available = int(prepared["test_labels"].shape[0])
    if count > available:
        raise ValueError(f"--canaries {count}: black-box canaries are held-out test examples, and "
                         f"{prepared['task']} has {available}")
    generator = torch.Generator().manual_seed(randomness.seed("audit_input_canary_choice"))
    pick = torch.randperm(available, generator=generator)[:count]
    return InputCanaries(tuple(f[pick] for f in prepared["test_features"]), prepared["test_labels"][pick],
                         num_classes, randomness)


def trained_model_loss(network, result):
    """Per-example loss of the run's model (w0 + its task vector, with its head) as a function of a batch."""
    import torch

    from dpmerge.models.base import TaskModel, task_model_weights
    from dpmerge.models.losses import task_loss

    w0 = network.top_state()
    model = TaskModel.with_head(network, result.head)

    def loss(features, labels):
        network.load_top_state(task_model_weights(w0, result.task_vector))
        try:
            with torch.no_grad(), network.autocast():
                return task_loss(model(*(f.to(network.device) for f in features)), labels.to(network.device),
                                 reduction="none").cpu()
        finally:
            network.load_top_state(w0)

    return loss
