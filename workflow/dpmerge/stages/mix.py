"""A task's release at a target epsilon from its models at other budgets, without training (privacy/mixing.py):
`dpmerge mix`. The components are one task's task vectors and heads from one w0; one of them is released, drawn
with the selection's probabilities from a secret stream keyed by the mixture's identity. `dpmerge combine`
releases a linear combination instead: the weighted average of independent repetitions at one budget, at the
composition of all of them.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import torch

from dpmerge.artifacts import PRIVACY_FIELDS, RELEASE_HASH, load_tensors, read_metadata, save_released
from dpmerge.privacy.accounting import accounted_size
from dpmerge.privacy.mixing import check_components, combination_epsilon, mixture_record_epsilon, plan_selection
from dpmerge.privacy.randomness import MechanismRandomness
from dpmerge.privacy.release import checked_release_records
from dpmerge.privacy.release_log import publish, release_log_path
from dpmerge.privacy.study_key import StudyKeyError, load_or_create_key, mechanism_fingerprint
from dpmerge.report.mixing import mixing_summary, plot_mixing, write_mixing_table
from dpmerge.stages.common import log

# The record fields that must agree between a component's task vector and its head (one run's two files)
_RUN_FIELDS = ("method", "spent_epsilon", "noise_multiplier", "sample_rate", "steps_by_queries", "seed",
               "pretrained_sha256", "num_train_examples", "public_n", "neighbouring", "task", "backbone")


def _components(task_vectors: list[str], heads: list[str],
                agree=("task", "backbone", "method", "seed")) -> list[dict]:

    if len(task_vectors) != len(heads):
        raise ValueError(f"give one head per task vector: {len(task_vectors)} task vectors, {len(heads)} heads")
    records = checked_release_records(task_vectors)
    for vector, head, record, head_record in zip(task_vectors, heads, records, checked_release_records(heads)):
        if record.get("artifact") != "task_vector" or head_record.get("artifact") != "head":
            raise ValueError(f"{vector} and {head}: expected a task vector and its head (fields 'artifact')")
        if differing := [f for f in _RUN_FIELDS if record.get(f) != head_record.get(f)]:
            raise ValueError(f"{head} is not the head of {vector}: they differ in {', '.join(differing)}")
        if "mixture" in record:
            raise ValueError(f"{vector} is itself a mixture; mix the trained releases it came from")
    for field in agree:
        if len(values := {str(r.get(field)) for r in records}) > 1:
            raise ValueError(f"components disagree on {field} ({', '.join(sorted(values))}): a mixture is of one "
                             f"task's releases by one method" + (" and repetition" if "seed" in agree else
                                                                 " at one budget"))
    return records


def draw_component(probabilities: list[float], uniform: float) -> int:
    """The index i with P(i) = p_i, from one uniform in [0, 1) (inverse CDF)."""
    total = 0.0
    for index, p in enumerate(probabilities):
        total += p
        if uniform < total:
            return index
    return max(i for i, p in enumerate(probabilities) if p > 0)  # uniform within rounding of 1


def mix(*, task_vectors: list[str], heads: list[str], target_epsilon: float, delta: float | None,
        utilities: list[float] | None, study_key: str, rng: str, out_vector: str, out_head: str) -> dict:
    """Release one of `task_vectors` (with its head) at `target_epsilon`: the selection's probabilities meet
    (target_epsilon, delta) with the largest expected utility (default utility: each component's budget), and
    the draw is secret. Returns the mixture's record entry."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"--target-epsilon must be a positive number, got {target_epsilon}")
    records = _components(task_vectors, heads)
    # delta <= 1/N, N the size the components were accounted with (public_n under add/remove, never N itself)
    size_name, n = accounted_size(records[0])
    n = int(n)
    delta = min(float(r["delta"]) for r in records) if delta is None else float(delta)
    if not 0 < delta <= 1.0 / n:
        raise ValueError(f"--delta must be in (0, 1/{size_name}] = (0, {1.0 / n:g}] for {size_name} = {n}, "
                         f"got {delta:g}")
    if utilities is not None and len(utilities) != len(records):
        raise ValueError(f"--utilities: one per component ({len(records)}), got {len(utilities)}")
    selection = plan_selection(records, target_epsilon, delta, utilities)
    try:
        key = load_or_create_key(study_key)
    except StudyKeyError as error:
        raise ValueError(f"--study-key: {error}") from None
    first = records[0]
    # Keyed by everything that makes this mixture this mechanism: its components and its target
    identity = {"mechanism": "mix", "backbone": first["backbone"], "task": first["task"], "method": first["method"],
                "seed": first["seed"], "target_epsilon": float(target_epsilon), "delta": delta,
                "components": [float(r["target_epsilon"]) for r in records]}
    uniform = float(MechanismRandomness(key, identity, rng).stream("selection").uniform(1)[0])
    chosen = draw_component(selection.probabilities, uniform)
    mixture = {
        "mode": "selection",
        "probabilities": selection.probabilities,
        "component_epsilons": [float(r["target_epsilon"]) for r in records],
        "component_deltas_at_target": selection.component_deltas,
        # publishing which component was drawn costs nothing: the index has the same law on neighbouring data
        "selected": chosen,
        "components": [{field: r.get(field) for field in PRIVACY_FIELDS} for r in records],
        "accountant": "pld (dp_accounting), joint convexity of the hockey-stick divergence",
    }
    tensors, head = load_tensors(task_vectors[chosen])[0], load_tensors(heads[chosen])[0]
    # the drawn release's record (its w0's hashes, settings, ...) with the mixture's guarantee in place of its own
    record = {k: v for k, v in records[chosen].items() if k not in ("artifact", "task", "backbone")}
    record.update(target_epsilon=float(target_epsilon), spent_epsilon=selection.epsilon, delta=delta,
                  accountant="pld_mixture", mixture=mixture)
    where = {"backbone": first["backbone"], "task": first["task"]}
    # logged beside the key that drew it, before it is published, as a function of its components (whose budgets
    # the ledger composes already): a release is forever, and its file is checked against the log like any other
    publish(release_log_path(study_key), mechanism=mechanism_fingerprint(key, identity), record=record, where=where,
            files=[(out_head, head, "head"), (out_vector, tensors, "task_vector")],
            post_processing_of=[*task_vectors, *heads])
    log(f"[mix] {first['task']}: p = {[round(p, 4) for p in selection.probabilities]} over budgets "
        f"{mixture['component_epsilons']} meets epsilon {selection.epsilon:.3f} <= {target_epsilon:g} at delta "
        f"{delta:.3g}; released {out_vector}")
    return mixture


def combine(*, task_vectors: list[str], heads: list[str], target_epsilon: float, weights: list[float] | None,
            seed: int, out_vector: str, out_head: str, release_log: str | None = None) -> dict:
    """Release sum_i a_i w_i (task vectors and heads alike) of independent repetitions of one task's release at one
    budget: post-processing of releasing them all, so it spends their composition, which must meet
    `target_epsilon` at the components' delta. Default weights: 1/k each. `seed` is the combination's own
    repetition index (its components' seeds are recorded). `release_log`: the study's log, where the combination is
    logged as a function of its components (none: not logged; a combination draws no randomness, so it reads no
    key to find the log beside). Returns the combination's record entry."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"--target-epsilon must be a positive number, got {target_epsilon}")
    records = _components(task_vectors, heads, agree=("task", "backbone", "method", "target_epsilon"))
    if len(records) < 2:
        raise ValueError("a combination needs two or more releases; one alone is that release")
    seeds = [r.get("seed") for r in records]
    if len(set(map(str, seeds))) < len(seeds):
        raise ValueError(f"components repeat a seed ({seeds}): a combination is of independent repetitions, "
                         f"each run from its own keyed randomness")
    check_components(records, task_vectors)
    weights = [1.0 / len(records)] * len(records) if weights is None else [float(a) for a in weights]
    if len(weights) != len(records) or not all(math.isfinite(a) for a in weights):
        raise ValueError(f"--weights: one finite number per component ({len(records)}), got {weights}")
    delta = max(float(r["delta"]) for r in records)
    epsilon = combination_epsilon(records, delta)
    if epsilon > target_epsilon:
        raise ValueError(f"the composition of these {len(records)} releases at epsilon "
                         f"{records[0]['target_epsilon']} spends {epsilon:.4f} > --target-epsilon {target_epsilon:g}"
                         f" at delta {delta:.3g}; combine fewer or cheaper releases")

    def average(paths):
        loaded = [load_tensors(p)[0] for p in paths]
        names = set(loaded[0])
        if any(set(t) != names for t in loaded):
            raise ValueError(f"{', '.join(paths)}: the components hold different tensors; not one model's releases")
        return {n: sum(a * t[n].to(torch.float64) for a, t in zip(weights, loaded)).to(loaded[0][n].dtype)
                for n in sorted(names)}

    first = records[0]
    combination = {
        "mode": "combination",
        "weights": weights,
        "component_epsilons": [float(r["target_epsilon"]) for r in records],
        "component_seeds": seeds,
        "components": [{field: r.get(field) for field in PRIVACY_FIELDS} for r in records],
        "accountant": f"{first['accountant']} composition of every component (independent runs on the same data)",
    }
    record = {k: v for k, v in first.items() if k not in ("artifact", "task", "backbone")}
    record.update(target_epsilon=float(target_epsilon), spent_epsilon=epsilon, delta=delta, seed=int(seed),
                  accountant=f"{first['accountant']}_composition", mixture=combination)
    where = {"backbone": first["backbone"], "task": first["task"]}
    files = [(out_head, average(heads), "head"), (out_vector, average(task_vectors), "task_vector")]
    if release_log is None:
        for path, tensors, artifact in files:
            save_released(path, tensors, record, {**where, "artifact": artifact})
    else:
        # deterministic and public given its components: its identity is what it is a function of, and how
        identity = json.dumps({"mechanism": "combine", "components": [r.get(RELEASE_HASH) for r in records],
                               "weights": weights, "seed": int(seed)}, sort_keys=True)
        publish(release_log, mechanism="combine:" + hashlib.sha256(identity.encode()).hexdigest(), record=record,
                where=where, files=files, post_processing_of=[*task_vectors, *heads])
    log(f"[combine] {first['task']}: {len(records)} releases at epsilon {first['target_epsilon']} (seeds {seeds}), "
        f"weights {[round(a, 4) for a in weights]}, spend {epsilon:.3f} <= {target_epsilon:g} at delta {delta:.3g}; "
        f"released {out_vector}")
    return combination


def mix_report(*, mixed: list[str], vectors: list[str], trained: list[str], out_prefix: str,
               figure: list[str], combined: list[str] = (), combined_vectors: list[str] = ()) -> None:
    """The mixing table and figure (report/mixing.py) from the mixtures' and combinations' merged scores and task
    vectors and the trained releases' merged scores; every release's epsilon recomputed from its record, and
    refused above its target."""
    rows = []
    for path, release in [*((p, "selection") for p in vectors), *((p, "combination") for p in combined_vectors)]:
        record = read_metadata(path)
        mode = record.get("mixture", {}).get("mode", "selection")
        if "mixture" not in record or mode != release:
            raise ValueError(f"{path}: not a {release} (its record's field 'mixture' is "
                             f"{'absent' if 'mixture' not in record else mode!r}); give 'dpmerge "
                             f"{'mix' if release == 'selection' else 'combine'}' outputs")
        recomputed = mixture_record_epsilon(record)
        if recomputed > float(record["target_epsilon"]) * (1 + 1e-9):
            raise ValueError(f"{path}: its record's components spend epsilon {recomputed:.4f}, above its target "
                             f"{record['target_epsilon']}")
        mixture = record["mixture"]
        if release == "selection":
            largest = mixture["probabilities"][int(np.argmax(mixture["component_epsilons"]))]
            components = ", ".join(f"{e:g}" for e in mixture["component_epsilons"])
        else:
            largest = math.nan
            components = f"{len(mixture['components'])} × {mixture['component_epsilons'][0]:g}"
        rows.append({"backbone": record["backbone"], "method": record["method"], "task": record["task"],
                     "target_epsilon": float(record["target_epsilon"]), "release": release,
                     "recomputed_epsilon": recomputed, "p_largest": largest, "components": components,
                     "combination_epsilon": combination_epsilon(mixture["components"], float(record["delta"]))})
    mixed_scores = pd.concat([pd.read_parquet(p) for p in mixed], ignore_index=True)
    trained_scores = pd.concat([pd.read_parquet(p) for p in trained], ignore_index=True)
    combined_scores = (pd.concat([pd.read_parquet(p) for p in combined], ignore_index=True) if combined
                       else None)
    summary = mixing_summary(mixed_scores, trained_scores, pd.DataFrame(rows), combined_scores)
    caption = ("Releases at a target epsilon without training, merged, beside releases trained at that budget: "
               "random selection among a method's releases at the other budgets (arXiv 2604.20985) and, where "
               "configured, a linear combination (the average of independent repetitions at one budget, at their "
               "composition). Merged score averaged over tasks (0-100); differences paired per seed (a "
               "combination of seeds' chunk j with seed j), with 95 % intervals from two pairs on. A linear "
               "combination of all of a selection's components would cost their composition (last column). These "
               "epsilons hold for a deployment that releases only them, not the components.")
    write_mixing_table(summary, out_prefix, caption)
    plot_mixing(mixed_scores, trained_scores, figure, combined_scores)
    log(f"[mix-report] {len(summary)} settings from {len(rows)} mixed task vectors; wrote {out_prefix}.md")
