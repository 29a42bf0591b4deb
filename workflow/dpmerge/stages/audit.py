"""Empirical privacy audits of the fine-tuning mechanisms (privacy/audit.py). Command: `dpmerge audit`.

An audit run is the release's mechanism (the same method, settings, budget and data) run once more with m
canaries (training/canaries.py) under its own identity, so its randomness is independent of every release's:
`white_box` Dirac gradients in the DP step, scored on the task vector; or `black_box` mislabeled held-out
examples in the training set, scored by the trained model's loss on them. Its task vector is never released;
what is published is the lower bound epsilon_lb from the canaries' scores, beside the epsilon the accountant
gives the run's own record at the audit's delta (and no timing: a run's wall time is a side channel).

Privacy of the published bound: the audit run reads the task's private training data, so it is one more
(epsilon, delta) mechanism on that task. The bound is a function of its task vector and the secret coins
(which are independent of the data): post-processing of a run within that budget. The audit's row carries the
run's full privacy record so that the task's composition can count it.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import torch

from dpmerge.artifacts import atomic_write
from dpmerge.epsilon import epsilon_column_value
from dpmerge.merge.registry import OPERATORS, is_personalized, merge
from dpmerge.models.base import TaskModel, task_model_weights
from dpmerge.models.losses import task_loss
from dpmerge.models.spec import backbone_from_spec
from dpmerge.privacy.audit import audit_scores, exposure_difference
from dpmerge.privacy.audit_ledger import build_audit_ledger, claimed_epsilon
from dpmerge.privacy.randomness import MechanismRandomness
from dpmerge.privacy.release_log import (
    audit_run_settings,
    check_replacement,
    publish_file,
    release_log_path,
    run_settings,
)
from dpmerge.privacy.study_key import mechanism_fingerprint
from dpmerge.report.audit import audit_summary, group_summary, plot_audit, write_audit_table
from dpmerge.stages.common import log, write_parquet
from dpmerge.stages.finetune import backbone_settings, training_inputs
from dpmerge.training.canaries import InputCanaries, WhiteBoxAudit, dirac_scores
from dpmerge.training.finetune import finetune_identity, train

AUDIT_DELTA = 1e-5  # the delta the bound is stated at: its 2 m delta term must be small beside 1
AUDIT_KINDS = ("white_box", "black_box")


def audit(*, backbone: str, backbone_spec: dict, data: str, method: str, hparams: dict, epsilon: float | None,
          seed: int, study_key: str, out: str, canaries: int = 1000, audit_delta: float = AUDIT_DELTA,
          confidence: float = 0.95, zeroshot_head: str | None = None, kind: str = "white_box",
          keep_run: str | None = None, groups: dict[str, list[str]] | None = None,
          replace_release: bool = False) -> dict:
    """Run `method` on the task in `data` with `canaries` canaries of `kind` and write one Parquet row: epsilon_lb
    at `audit_delta` and `confidence`, the accountant's epsilon for the run at that delta, and the verdict (FAIL
    when the bound exceeds the claim). Returns the row. `keep_run`: a private file (mode 0600) keeping the run's
    vector, head and canaries with their coins, for `audit_merged`. `groups` (black-box only): {name: class
    names}; each group's canaries (and the rest's) get a bound of their own, in rows beside the whole audit's
    (`group` "all"), e.g. whether a class with a spurious feature is more exposed. The rows are a release of the
    task's data: logged in the study's release log before they are written, and refused where the log holds
    another run's audit at `out` unless `replace_release`."""
    if kind not in AUDIT_KINDS:
        raise ValueError(f"--kind must be one of {', '.join(AUDIT_KINDS)}, got {kind!r}")
    if canaries < 2:
        raise ValueError(f"--canaries must be at least 2, got {canaries}")
    if groups and kind != "black_box":
        raise ValueError("--group: groups are classes of held-out examples, so only a black_box audit has them")
    require_power(canaries, audit_delta, "--audit-delta")
    prepared, network, config, head, key = training_inputs(
        backbone_spec=backbone_spec, data=data, method=method, hparams=hparams, epsilon=epsilon, seed=seed,
        study_key=study_key, zeroshot_head=zeroshot_head)
    check_groups(groups or {}, prepared)  # before the run: a typo must not cost a training run
    # a black-box audit's groups choose its canaries: another mechanism, whose coins must be its own
    identity = {"backbone": backbone, "task": prepared["task"], "method": method,
                "backbone_settings": backbone_settings(backbone_spec),
                "audit": {"kind": kind, "canaries": canaries, **({"groups": groups} if groups else {})}}
    num_classes = prepared["task_spec"]["num_classes"]
    # keyed by the audit run's full identity (every setting, the seed, the weights), as its sampler and noise are
    mechanism = finetune_identity(config, identity, network.checkpoint_sha256)
    release_log, tag = release_log_path(study_key), mechanism_fingerprint(key, mechanism)
    check_replacement(release_log, [out], tag, allowed=replace_release)  # before the run: a refusal costs nothing
    inputs = None
    if kind == "black_box":
        grouped = {prepared["class_names"].index(c) for classes in (groups or {}).values() for c in classes}
        inputs = held_out_canaries(prepared, canaries, num_classes, MechanismRandomness(key, mechanism, config.rng),
                                   grouped)
    result = train(network, num_classes, tuple(prepared["train_features"]), prepared["train_labels"], config,
                   study_key=key, identity=identity, log=log, head=head, train_head=head is None,
                   audit=WhiteBoxAudit(canaries) if kind == "white_box" else inputs)
    record = result.record
    if kind == "white_box":
        scores, included = result.canaries.scores(result.task_vector), result.canaries.included
    else:
        scores = inputs.scores(model_loss(network, network.top_state(), result.task_vector, result.head))
        included = inputs.included
    bound = audit_scores(scores.numpy(), included.numpy(), audit_delta, confidence)
    claimed = claimed_epsilon(record, audit_delta)
    row = {
        "backbone": backbone, "task": prepared["task"], "method": method,
        "target_epsilon": epsilon_column_value(record["target_epsilon"]), "seed": seed, "audit": kind, **bound,
        "audit_delta": audit_delta,
        "claimed_epsilon_at_audit_delta": claimed, "verdict": verdict(bound, claimed),
        "privacy_record": json.dumps(record, sort_keys=True, default=str),
    }
    if keep_run:
        canary_state = ({"coordinates": result.canaries.coordinates, "names": [n for n, _ in
                                                                              result.canaries.released_layout]}
                        if kind == "white_box" else {"features": list(inputs.features), "labels": inputs.labels})
        kept = {"row": row, "record": record, "kind": kind, "task_vector": result.task_vector, "head": result.head,
                "included": included, "scores": scores.double(), "canaries": canary_state}
        atomic_write(keep_run, lambda tmp: torch.save(kept, tmp), private=True)  # the coins stay secret
    rows = [{**row, "group": "all"}]
    if groups:
        rows += group_rows(row, groups, prepared["class_names"], inputs.true_labels, scores, included, audit_delta,
                           confidence, claimed)
    rows = [{k: v.item() if hasattr(v, "item") else v for k, v in r.items()} for r in rows]  # JSON's own types
    settings = audit_run_settings(run_settings(method=method, epsilon=epsilon, seed=seed, hparams=hparams,
                                           backbone_settings=backbone_settings(backbone_spec)),
                              kind=kind, canaries=canaries, groups=groups)
    publish_file(release_log, mechanism=tag, path=out, artifact="audit", settings=settings,
                 write=lambda tmp: pd.DataFrame(rows).to_parquet(tmp, index=False),
                 metadata={**identity, "target_epsilon": row["target_epsilon"], "seed": seed, "rows": rows})
    log(f"[audit] {backbone}/{prepared['task']}/{method}: epsilon_lb {bound['epsilon_lb']:.3f} at delta "
        f"{audit_delta:g} ({bound['correct']}/{bound['guesses']} guesses right, {canaries} canaries), claimed "
        f"{claimed:.3f}: {row['verdict']}")
    return row


def check_groups(groups: dict[str, list[str]], prepared: dict) -> None:
    for name, classes in groups.items():
        unknown = sorted(set(classes) - set(prepared["class_names"]))
        if unknown or name in ("all", "rest"):
            raise ValueError(f"--group {name}: {unknown or name!r} is not a class of {prepared['task']} "
                             f"({', '.join(prepared['class_names'])}) or is a reserved group name")


def require_power(canaries: int, delta: float, name: str) -> None:
    """Refuse an audit whose bound's 2 m delta term leaves it no power (Steinke et al.'s delta term)."""
    if not 0 < delta or 2 * canaries * delta > 0.1:
        raise ValueError(f"{name} {delta:g} with {canaries} canaries: the bound's 2 m delta term "
                         f"({2 * canaries * delta:.3g}) must stay below 0.1, or the audit has no power; "
                         f"use a delta of at most {0.05 / canaries:.2g}")


def verdict(bound: dict, claim: float) -> str:
    """FAIL when the audit refutes the claim: a bound above it means the run is not the mechanism it says."""
    return "FAIL" if bound["epsilon_lb"] > claim else "PASS"


def group_rows(row: dict, groups: dict[str, list[str]], class_names: list[str], true_labels, scores, included,
               audit_delta: float, confidence: float, claimed: float) -> list[dict]:
    """One row per group of classes and one for the remaining classes: the bound from that group's canaries
    alone (their coins are independent, so each is a valid bound; with fewer canaries it has less power)."""
    masks, covered = [], set()
    for name, classes in groups.items():  # checked against class_names before the run
        covered |= set(classes)
        members = {class_names.index(c) for c in classes}
        masks.append((name, [int(label) in members for label in true_labels.tolist()]))
    masks.append(("rest", [class_names[label] not in covered for label in true_labels.tolist()]))
    bounds = {}
    for name, mask in masks:
        mask = torch.tensor(mask, dtype=torch.bool)
        if int(mask.sum()) < 2:
            raise ValueError(f"--group {name}: {int(mask.sum())} of the canaries are of its classes; need 2 or more")
        bounds[name] = audit_scores(scores[mask].numpy(), included[mask].numpy(), audit_delta, confidence)
    out = []
    for name, bound in bounds.items():
        # exposure against the other classes': AUC difference with its interval (NaN for "rest" itself)
        difference = (math.nan,) * 3 if name == "rest" else exposure_difference(bound, bounds["rest"], confidence)
        out.append({**row, **bound, "group": name, "verdict": verdict(bound, claimed),
                    **dict(zip(("auc_minus_rest", "auc_minus_rest_low", "auc_minus_rest_high"), difference))})
        log(f"[audit] group {name}: epsilon_lb {bound['epsilon_lb']:.3f} from {bound['canaries']} canaries, AUC "
            f"{bound['auc']:.3f} [{bound['auc_low']:.3f}, {bound['auc_high']:.3f}]")
    return out


def held_out_canaries(prepared: dict, count: int, num_classes: int, randomness, grouped: set[int] = frozenset()):
    """`count` test examples of the task, a keyed random subset, as black-box canaries (never in the training
    split, so a canary is in the audit run's training set exactly when its coin says so). Examples of the
    `grouped` classes come first, up to half the canaries: a group audited alone needs every canary it can get,
    and the choice is made before any coin, so it biases no guess."""
    labels = prepared["test_labels"]
    available = int(labels.shape[0])
    if count > available:
        raise ValueError(f"--canaries {count}: black-box canaries are held-out test examples, and "
                         f"{prepared['task']} has {available}")
    generator = torch.Generator().manual_seed(randomness.seed("audit_input_canary_choice"))
    order = torch.randperm(available, generator=generator)
    in_group = torch.tensor([int(label) in grouped for label in labels[order].tolist()], dtype=torch.bool)
    first = order[in_group][: count // 2] if grouped else order[:0]
    pick = torch.cat([first, order[~torch.isin(order, first)]])[:count]
    return InputCanaries(tuple(f[pick] for f in prepared["test_features"]), prepared["test_labels"][pick],
                         num_classes, randomness)


def model_loss(network, w0: dict, vector: dict, head: dict):
    """Per-example loss of the model w0 + `vector` with `head`, as a function of a batch (features, labels); the
    shared network is back at w0 after each call."""
    model = TaskModel.with_head(network, head)

    def loss(features, labels):
        network.load_top_state(task_model_weights(w0, vector))
        try:
            with torch.no_grad(), network.autocast():
                return task_loss(model(*(f.to(network.device) for f in features)), labels.to(network.device),
                                 reduction="none").cpu()
        finally:
            network.load_top_state(w0)

    return loss


def audit_merged(*, runs: list[str], operator: str, params: dict, backbone_spec: dict, out: str,
                 keep_scores: str | None = None) -> list[dict]:
    """Merge the kept audit runs of one release group (one per task, `dpmerge audit --keep-run`) with `operator`
    and audit each task's canaries on the merged model, one Parquet row per task. Merging is post-processing, so
    a merged model's bound above its task's claim is a FAIL like an individual's. `keep_scores`: a private file
    (mode 0600) with every task's canary scores on the merged model and their coins, for `audit_pooled`."""
    if operator not in OPERATORS or is_personalized(operator):
        raise ValueError(f"--method {operator!r}: an audit merges with a registered operator that makes one model")
    kept = [load_kept(path, "a kept audit run ('dpmerge audit --keep-run')") for path in runs]
    rows = [k["row"] for k in kept]
    for field in ("backbone", "method", "target_epsilon", "audit", "seed"):
        if len({str(r[field]) for r in rows}) != 1:
            raise ValueError(f"the runs differ in {field} ({sorted({str(r[field]) for r in rows})}): one release "
                             "group's audits merge together")
    tasks = [r["task"] for r in rows]
    if len(set(tasks)) != len(tasks) or len(tasks) < 2:
        raise ValueError(f"one kept run per task, at least two: got tasks {tasks}")
    if len({k["record"]["w0_sha256"] for k in kept}) != 1:
        raise ValueError("the runs were trained from different w0")
    merged = merge(operator, [k["task_vector"] for k in kept], **params)
    network = w0 = None
    out_rows, scored = [], []
    for path, run in zip(runs, kept):
        row = run["row"]
        if run["kind"] == "white_box":
            scores = dirac_scores(run["canaries"]["names"], run["canaries"]["coordinates"], merged)
        else:
            if network is None:
                network = backbone_from_spec(backbone_spec)
                w0 = network.top_state()
            loss = model_loss(network, w0, merged, run["head"])
            scores = -loss(tuple(run["canaries"]["features"]), run["canaries"]["labels"])
        bound = audit_scores(scores.double().numpy(), run["included"].numpy(), row["audit_delta"], row["confidence"])
        claimed = claimed_epsilon(run["record"], row["audit_delta"])
        scored.append({"row": row, "record": run["record"], "scores": scores.double(), "included": run["included"]})
        out_rows.append({
            **{k: row[k] for k in ("backbone", "task", "method", "target_epsilon", "seed", "audit")},
            "model": "merged", "operator": operator, "individual_epsilon_lb": row["epsilon_lb"], **bound,
            "audit_delta": row["audit_delta"], "claimed_epsilon_at_audit_delta": claimed,
            "verdict": verdict(bound, claimed),
        })
        log(f"[audit] {operator} of {len(runs)} runs, {row['task']}: epsilon_lb {bound['epsilon_lb']:.3f} "
            f"(individual {row['epsilon_lb']:.3f}, claimed {claimed:.3f}): {out_rows[-1]['verdict']}")
    if keep_scores:
        kept_scores = {"operator": operator, "params": params, "runs": scored}
        atomic_write(keep_scores, lambda tmp: torch.save(kept_scores, tmp), private=True)  # the coins stay secret
    write_parquet(out_rows, out)
    return out_rows


def load_kept(path: str, what: str) -> dict:
    """A private file of an audit's scores and coins (`--keep-run`, `--keep-scores`), or an error naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path} is not {what}: {error}") from None


POOLED_FIELDS = ("backbone", "method", "target_epsilon", "audit", "audit_delta", "confidence")


def audit_pooled(*, runs: list[str], merged: list[str] = (), out: str) -> list[dict]:
    """One audit of a whole release group: the canaries of every kept run (`dpmerge audit --keep-run`: its tasks,
    and seeds) pooled into one bound, and per merge operator the canaries of every task on its merged models
    (`dpmerge audit-merge --keep-scores`) pooled likewise (privacy/audit.py: why pooling independent runs is one
    valid audit). The claim is the largest of the runs' claims; a bound above it is a FAIL."""
    if not runs:
        raise ValueError("no kept audit runs to pool")
    kept = [load_kept(path, "a kept audit run ('dpmerge audit --keep-run')") for path in runs]
    if old := [path for path, k in zip(runs, kept) if "scores" not in k]:
        raise ValueError(f"{old[0]}: kept before runs kept their canaries' scores; run its audit again")
    scored_runs = {path: load_kept(path, "a merged audit's scores ('dpmerge audit-merge --keep-scores')")
                   for path in merged}
    everything = kept + [run for scored in scored_runs.values() for run in scored["runs"]]
    for field in POOLED_FIELDS:
        if len({str(unit["row"][field]) for unit in everything}) != 1:
            raise ValueError(f"the pooled runs differ in {field} ({sorted({str(u['row'][field]) for u in everything})}"
                             "): one backbone, method, budget and audit kind pool together")
    first = kept[0]["row"]

    def component(unit) -> str:
        return f"{unit['row']['task']}/s{unit['row']['seed']}"

    components = [component(u) for u in kept]
    if len(set(components)) != len(components):
        raise ValueError(f"a run is given twice: {sorted(c for c in components if components.count(c) > 1)}")
    claims = {component(u): claimed_epsilon(u["record"], first["audit_delta"]) for u in kept}

    def pooled_row(pool: list[dict], model: str, operator: str | None) -> dict:
        names = [component(u) for u in pool]
        if missing := sorted(set(names) - set(claims)):
            raise ValueError(f"merged scores of {missing} have no kept run among the runs pooled")
        if len(set(names)) != len(names):
            raise ValueError(f"{operator}: a task and seed scored twice ({sorted(names)})")
        scores = torch.cat([u["scores"].double() for u in pool]).numpy()
        included = torch.cat([u["included"] for u in pool]).numpy()
        require_power(scores.size, first["audit_delta"], "the pooled runs' audit delta")
        bound = audit_scores(scores, included, first["audit_delta"], first["confidence"])
        claim = max(claims[name] for name in names)
        log(f"[audit] pooled {model}{' ' + operator if operator else ''} of {len(pool)} runs: epsilon_lb "
            f"{bound['epsilon_lb']:.3f} from {bound['canaries']} canaries, claimed {claim:.3f}")
        return {**{k: first[k] for k in ("backbone", "method", "target_epsilon", "audit")}, "task": "pooled",
                "seed": None, "model": model, "operator": operator, **bound, "audit_delta": first["audit_delta"],
                "claimed_epsilon_at_audit_delta": claim, "verdict": verdict(bound, claim),
                "pooled_runs": json.dumps(sorted(names))}

    rows = [pooled_row(kept, "individual", None)]
    operators: dict[str, list[dict]] = {}
    for scored in scored_runs.values():
        operators.setdefault(scored["operator"], []).extend(scored["runs"])
    rows += [pooled_row(pool, "merged", operator) for operator, pool in sorted(operators.items())]
    write_parquet(rows, out)
    return rows


def audit_report(*, audit_files: list[str], out_prefix: str, figure: list[str]):
    """The audits' table (report/audit.py: PREFIX.parquet, .md, .tex) and figure, from the audit ledger's rows
    (each claim recomputed from its run's record)."""
    audits = build_audit_ledger(audit_files)
    if not len(audits):
        raise ValueError("no audit rows in the given files")
    summary = audit_summary(audits)
    confidence = ", ".join(sorted({f"{100 * c:g} %" for c in pd.read_parquet(audit_files[0])["confidence"]}))
    caption = (f"One-run privacy audits (Steinke et al. 2023): the lower bound on epsilon at {confidence} "
               "confidence and the audit's delta from every task's (and seed's) canaries pooled in one audit, beside "
               "the largest epsilon the accountant gives the audited runs. A lower bound, not a guarantee: a bound "
               "far below the claim says the audit had little power, not that the claim is loose.")
    write_audit_table(summary, out_prefix, caption, group_summary(audits))
    plot_audit(audits[audits["group"] == "all"], figure, "Audited epsilon against the claim")
    log(f"[audit] {len(audits)} audited models in {len(summary)} settings -> {out_prefix}.md")
    return summary
