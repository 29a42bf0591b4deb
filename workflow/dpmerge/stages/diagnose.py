"""The paper's diagnostics of task models and merges, each written as a Parquet table. Rules (diagnostics.smk):
drift (reference drift, Fig. 3b), interpolation (loss from w_t to w_merge, Fig. 2), curvature (sharpness,
lambda_max, merge gap and Theorem 5.2's bound), landscape (2-D loss landscape, App. B.4) and linearity
(joint-task loss linearity, Theorem C.8).

Every model-based diagnostic scores each task with its own head on the same seeded test subsample
(common.fixed_test_subsample).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.artifacts import load_tensors, missing_privacy_fields
from dpmerge.diagnostics.common import task_loss
from dpmerge.diagnostics.curvature import merge_gap_bound, sharpness_proxy
from dpmerge.diagnostics.drift import reference_drift
from dpmerge.diagnostics.interpolation import barrier_height, interpolation_curve
from dpmerge.diagnostics.landscape import filter_normalized_direction, loss_landscape, task_vector_plane
from dpmerge.diagnostics.linearity import joint_task_linearity
from dpmerge.merge.covariance import gate_readings
from dpmerge.merge.sources import SafetensorsSource
from dpmerge.models.base import task_model_weights
from dpmerge.models.spec import backbone_from_spec
from dpmerge.runtime import compute_section, progress
from dpmerge.stages.common import (
    checked_w0,
    fixed_test_subsample,
    load_heads_and_data,
    log,
    merge_label,
    read_task_vectors,
    release_identity,
    write_parquet,
)


def drift(*, base: str, task_vectors: list[str], out: str) -> None:
    """Reference drift ||w_t - w0|| / ||w0|| per task vector and its mean. Measuring is post-processing, so plain
    task vectors (no privacy record, from anyone) are measured too, their base checked wherever they say which
    w0 they come from; a row's task is then the file's name."""
    vectors, metas = read_task_vectors(task_vectors, require_record=False)
    for path, meta in zip(task_vectors, metas):
        if meta.get("artifact", "task_vector") != "task_vector":
            raise ValueError(f"{path} is a {meta['artifact']}, not a task vector: drift measures task vectors")
    released = all(not missing_privacy_fields(meta) for meta in metas)
    w0 = checked_w0(base, metas, task_vectors, strict=released)
    mean, per_task = reference_drift(w0, vectors)
    rows = [{**release_identity(m), "task": m.get("task", Path(p).stem), "drift": d, "mean_drift": mean}
            for m, d, p in zip(metas, per_task, task_vectors)]
    write_parquet(rows, out)
    log(f"[drift] mean reference drift {mean:.6f}")


def ace_gates(*, task_vectors: list[str], out: str, gamma_threshold: float = 0.3, include_conv: bool = True) -> None:
    """What ACE-Merging sees in these task vectors, per weight matrix and task: its heterogeneity gamma, whether its
    gate opens (gamma > gamma_threshold: adaptive normalisation and spectral refinement switch on), each task's
    squared norm and the share of its estimated covariance above the noise floor (merge/covariance.py). Reads
    only the vectors, one tensor per task at a time: post-processing of releases, and plain vectors too."""
    source = SafetensorsSource(task_vectors)
    metas = [file.metadata or {} for file in source.files]
    rows, keys, started = [], source.keys(), time.perf_counter()
    for done, key in enumerate(keys, start=1):
        tensors = [source.tensor(index, key) for index in range(len(task_vectors))]
        for reading in gate_readings(key, tensors, gamma_threshold, include_conv):
            index = reading["task_index"]
            task = metas[index].get("task", Path(task_vectors[index]).stem)
            rows.append({**release_identity(metas[index]), "task": task, **reading})
        if done % 20 == 0 or done == len(keys):
            log(f"[ace-gates] {progress(done, len(keys), started)}")
    if not rows:
        raise ValueError("no weight matrix in these task vectors: ACE would only average them")
    write_parquet(rows, out)
    gates = pd.DataFrame(rows).drop_duplicates("tensor")
    log(f"[ace-gates] the gate opens on {int(gates['gate_open'].sum())} of {len(gates)} matrices "
        f"(gamma median {gates['gamma'].median():.3g})")


def diagnosed(backbone_spec: dict, base: str, task_vectors: list[str], heads: list[str], data: list[str],
              merged: str | None = None):
    """The opening every model diagnostic shares, in one order (so a bad input is named the same way by each):
    (network, task vectors, w0 checked against their records and the merged model's, each task's (head, record,
    prepared data), the merged model's tensors and metadata, None without `merged`)."""
    network = backbone_from_spec(backbone_spec)
    model, merged_meta = load_tensors(merged) if merged is not None else (None, None)
    vectors, metas = read_task_vectors(task_vectors)
    w0 = checked_w0(base, metas, task_vectors, merged_meta, merged)
    return network, vectors, w0, load_heads_and_data(heads, data), model, merged_meta


def interpolate(*, backbone_spec: dict, base: str, merged: str, task_vectors: list[str], heads: list[str],
                data: list[str], out: str, points: int = 11, max_examples: int = 200) -> None:
    """Loss and score along (1 - gamma) w_t + gamma w_merge at `points` gammas in [0, 1], and the barrier."""
    network, vectors, w0, tasks, model, merged_meta = diagnosed(backbone_spec, base, task_vectors, heads, data,
                                                                merged)
    merged_vector = {name: model[name] - w0[name] for name in w0}
    gammas = np.linspace(0.0, 1.0, points)
    rows = []
    started = time.perf_counter()
    with compute_section("interpolation curves", log):
        for done, (vector, (head, meta, prepared)) in enumerate(zip(vectors, tasks), start=1):
            features, labels = fixed_test_subsample(prepared, max_examples)
            n = int(labels.shape[0])
            curve = interpolation_curve(
                network, w0, vector, merged_vector, head, features, labels,
                prepared["task_spec"]["metric"], gammas,
            )
            barrier = barrier_height(gammas, np.array([r["loss"] for r in curve]))
            for point in curve:
                rows.append({**release_identity(meta), "operator": merge_label(merged_meta),
                             "task": prepared["task"], **point, "barrier": barrier, "num_examples": n})
            log(f"[interpolate] {prepared['task']}: barrier {barrier:.4f} ({progress(done, len(tasks), started)})")
    write_parquet(rows, out)


def curvature(*, backbone_spec: dict, base: str, merged: str, task_vectors: list[str], heads: list[str],
              data: list[str], out: str, rho: float = 0.05, iterations: int = 20, tolerance: float = 1e-3,
              gammas: list[float] = (0.0, 0.5, 1.0), max_examples: int = 64) -> None:
    """Per task model: sharpness proxy at radius `rho`, Hessian lambda_max by power iteration along the segment
    to the merged model (at `gammas`), the merge gap and Theorem 5.2's bound on it."""
    if not rho > 0:
        raise ValueError(f"--rho must be > 0, got {rho}")
    if iterations < 1 or max_examples < 1:
        raise ValueError(f"--iterations and --max-examples must be >= 1, got {iterations}, {max_examples}")
    if not gammas or any(not 0 <= g <= 1 for g in gammas) or gammas[0] != 0:
        raise ValueError(f"--gammas must start at 0 and lie in [0, 1], got {list(gammas)}")

    network, vectors, w0, tasks, model, merged_meta = diagnosed(backbone_spec, base, task_vectors, heads, data,
                                                                merged)
    rows = []
    started = time.perf_counter()
    with compute_section("sharpness, lambda_max and merge gap", log):
        for done, (vector, (head, meta, prepared)) in enumerate(zip(vectors, tasks), start=1):
            features, labels = fixed_test_subsample(prepared, max_examples)
            n = int(labels.shape[0])
            loss = task_loss(network, head, features, labels)
            task_params = task_model_weights(w0, vector)
            merged_params = {name: model[name] for name in w0}
            sharpness = sharpness_proxy(loss, task_params, rho)
            gap = merge_gap_bound(loss, task_params, merged_params, gammas, iterations, tolerance, seed=0)
            rows.append({**release_identity(meta), "operator": merge_label(merged_meta),
                         "task": prepared["task"], "sharpness_rho": rho, "sharpness": sharpness, **gap,
                         "gammas": json.dumps(list(gammas)), "iterations": iterations, "num_examples": n})
            log(f"[curvature] {prepared['task']}: sharpness {sharpness:.4g}, "
                f"lambda_max {gap['lambda_max_at_task']:.4g}, "
                f"merge gap {gap['merge_gap']:.4g} <= bound {gap['bound']:.4g} ({progress(done, len(tasks), started)})")
    write_parquet(rows, out)


def landscape(*, backbone_spec: dict, base: str, merged: str, heads: list[str], data: list[str], out: str,
              task_vectors: list[str] | None = None, plane: str = "random", points: int = 9, span: float = 1.0,
              max_examples: int = 64, seed: int = 0) -> None:
    """The 2-D loss landscape of a merged model (paper App. B.4, Figs. 4, 5): every task's test loss and their
    mean on the plane w_merge + a d1 + b d2, each task scored with its own head on a seeded test subsample.

    `plane` "random": two filter-normalised random directions (seeds `seed`, `seed` + 1); "task_vectors": the
    first two task vectors. Each coordinate runs over `points` values in [-span, span].
    """
    if points < 3:
        raise ValueError(f"--points must be >= 3 (the merged model and both sides of it), got {points}")
    if not (span > 0 and math.isfinite(span)):
        raise ValueError(f"--span must be a finite number > 0, got {span}")
    if max_examples < 1:
        raise ValueError(f"--max-examples must be >= 1, got {max_examples}")
    if plane == "task_vectors" and len(task_vectors or []) < 2:
        raise ValueError(f"--plane task_vectors needs at least two --task-vectors (the first two span the plane), "
                         f"got {len(task_vectors or [])}")


    started = time.time()
    network = backbone_from_spec(backbone_spec)
    model, merged_meta = load_tensors(merged)
    w0 = checked_w0(base, merged_meta=merged_meta, merged_path=merged)
    if missing := sorted(set(w0) - set(model)):
        raise ValueError(f"--merged {merged} lacks tensors of --base: {missing[:3]}")
    centre = {name: model[name] for name in w0}
    operator = merge_label(merged_meta)
    tasks = load_heads_and_data(heads, data)
    losses, examples = {}, {}
    for head, _, prepared in tasks:
        if prepared["task"] in losses:
            raise ValueError(f"task {prepared['task']!r} is given twice in --heads/--data")
        features, labels = fixed_test_subsample(prepared, max_examples)
        losses[prepared["task"]] = task_loss(network, head, features, labels)
        examples[prepared["task"]] = int(labels.shape[0])
    if plane == "random":
        d1, d2 = (filter_normalized_direction(centre, s) for s in (seed, seed + 1))
        spanned_by = (f"random (seed {seed})", f"random (seed {seed + 1})")
    else:
        vectors, metas = read_task_vectors(task_vectors[:2])
        d1, d2 = task_vector_plane(*vectors)
        spanned_by = (metas[0]["task"], metas[1]["task"])
    # linspace(-span, span, points) written so that the centre is exactly 0 for odd points: the grid then holds
    # the merged model itself, not a point a rounding error away from it
    half = (points - 1) / 2
    coordinates = span * (np.arange(points) - half) / half
    log(f"[landscape] {operator}: {plane} plane ({spanned_by[0]}, {spanned_by[1]}), {points}x{points} "
        f"points in [-{span:g}, {span:g}]^2, {len(losses)} tasks, {max(examples.values())} examples max")
    with compute_section("loss landscape", log):
        grid = loss_landscape(losses, centre, d1, d2, coordinates, coordinates,
                              log=lambda line: log(f"[landscape] {line}"))
    identity = {**release_identity(tasks[0][1]), "operator": operator, "plane": plane, "span": span,
                "direction_1": spanned_by[0], "direction_2": spanned_by[1]}
    # The mean row averages the tasks, so the examples behind it are all of theirs
    rows = [{**identity, **row, "num_examples": examples.get(row["task"], sum(examples.values()))} for row in grid]
    write_parquet(rows, out)
    log(f"[landscape] wrote {out} in {time.time() - started:.1f}s")


def curvature_lambdas(path: str):
    """lambda_max per task from a `dpmerge curvature` file, and the test subsample sizes it was measured on
    (empty for older files without them)."""
    table = pd.read_parquet(path)
    if "lambda_max_at_task" not in table.columns:
        raise ValueError(f"{path} has no lambda_max_at_task column; give a 'dpmerge curvature' file")
    lambda_max = table.drop_duplicates("task").set_index("task")["lambda_max_at_task"]
    used = set(table["num_examples"]) if "num_examples" in table.columns else set()
    return lambda_max, used


def linearity(*, curvature: str, backbone_spec: dict, base: str, task_vectors: list[str], heads: list[str],
              data: list[str], out: str, alphas: list[float] = (0.25, 0.5, 0.75), max_examples: int = 64) -> None:
    """Joint-task loss linearity per task pair at each alpha, beside its bound with the per-task lambda_max and
    subsample sizes read from the `dpmerge curvature` file `curvature` (curvature_lambdas)."""
    if not alphas or any(not 0 < a < 1 for a in alphas):
        raise ValueError(f"--alphas must lie strictly between 0 and 1, got {list(alphas)}")
    lambda_max, measured_on = curvature_lambdas(curvature)


    network, vectors, w0, tasks, _, _ = diagnosed(backbone_spec, base, task_vectors, heads, data)
    if len(tasks) < 2:
        raise ValueError("joint-task linearity needs two or more tasks")
    with compute_section("joint-task linearity", log):
        models = []
        for vector, (head, meta, prepared) in zip(vectors, tasks):
            task = prepared["task"]
            if task not in lambda_max.index:
                raise ValueError(f"{curvature} has no lambda_max for task {task!r}")
            features, labels = fixed_test_subsample(prepared, max_examples)
            if measured_on and int(labels.shape[0]) not in measured_on:
                raise ValueError(f"--max-examples gives {labels.shape[0]} examples of {task}, but "
                                 f"{curvature} measured lambda_max on {sorted(measured_on)}; use its max_examples")
            params = task_model_weights(w0, vector)
            models.append((task, meta, task_loss(network, head, features, labels), params))
        rows = []
        pairs = list(itertools.combinations(models, 2))
        started = time.perf_counter()
        for done, ((s, meta, loss_s, w_s), (t, _, loss_t, w_t)) in enumerate(pairs, start=1):
            for point in joint_task_linearity(loss_s, loss_t, w_s, w_t, alphas, float(lambda_max[s]),
                                              float(lambda_max[t])):
                rows.append({**release_identity(meta), "task_s": s, "task_t": t, **point})
            worst = max(rows[-len(alphas):], key=lambda r: abs(r["delta"]))
            log(f"[linearity] {s} / {t}: largest |delta| {abs(worst['delta']):.4g} at alpha {worst['alpha']:g}, "
                f"bound {worst['bound']:.4g} ({progress(done, len(pairs), started)})")
    write_parquet(rows, out)
