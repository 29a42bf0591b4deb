"""The effective noise scale of each release group beside its merge success. Rules (noise.smk): noise_scale
(one release group: T per task, from its records and a gradient-variance probe, joined with the group's
individual and merged scores and interpolation barriers) and noise_report (every group: table and figure).

Definition and its pieces: diagnostics/noise_scale.py.
"""

from __future__ import annotations

import time

import pandas as pd

from dpmerge.diagnostics.noise_scale import (
    effective_noise,
    mean_gradient_square,
    per_example_gradient_moments,
    sampling_noise_bound,
)
from dpmerge.models.base import TaskModel, task_model_weights
from dpmerge.models.spec import backbone_from_spec
from dpmerge.report.noise_readings import noise_readings, write_readings_table
from dpmerge.report.noise_scale import group_summary, plot_noise_scale, setting_summary, write_noise_table
from dpmerge.runtime import compute_section, progress
from dpmerge.stages.common import (
    checked_w0,
    fixed_test_subsample,
    load_heads_and_data,
    log,
    read_task_vectors,
    release_identity,
    write_parquet,
)

SWEEPS = ("centre", "lr", "batch_size", "weight_decay", "epsilon")


def _scores_by_task(path: str, model: str) -> dict[str, float]:
    """{task: score} of a task on its own model (individual) or on the merged model, from a `dpmerge evaluate`
    file."""
    table = pd.read_parquet(path)
    missing = {"model", "task", "score", "source_task"} - set(table.columns)
    if missing:
        raise ValueError(f"{path} lacks column(s) {sorted(missing)}; give a 'dpmerge evaluate' file")
    rows = table[table["model"] == "individual"] if model == "individual" else table[table["model"] != "individual"]
    if model == "individual":
        rows = rows[rows["source_task"] == rows["task"]]
    if rows.empty:
        raise ValueError(f"{path} has no {model} scores")
    return dict(zip(rows["task"], rows["score"].astype(float)))


def _barriers_by_task(path: str) -> dict[str, float]:

    table = pd.read_parquet(path)
    if not {"task", "barrier"} <= set(table.columns):
        raise ValueError(f"{path} has no barrier column; give a 'dpmerge interpolate' file")
    return table.drop_duplicates("task").set_index("task")["barrier"].astype(float).to_dict()


def _gradient_moments(network, w0: dict, vector: dict, head: dict, features, labels, clip_norm, train_head: bool):
    """(m, v, d) at the released model w0 + tau with its head, on the given examples."""
    network.load_top_state(task_model_weights(w0, vector))
    try:
        model = TaskModel.with_head(network, head)
        model.head.requires_grad_(train_head)
        model.eval()
        params = [p for p in model.parameters() if p.requires_grad]
        device = network.device
        features = tuple(f.to(device) for f in features)
        second_moment, variance = per_example_gradient_moments(model, params, features, labels.to(device),
                                                               clip_norm)
        return second_moment, variance, sum(p.numel() for p in params)
    finally:
        network.load_top_state(w0)


def noise_scale(*, backbone_spec: dict, base: str, task_vectors: list[str], heads: list[str], data: list[str],
                individual: str, merged: str, interpolation: str, label: str, sweep: str, out: str,
                max_examples: int = 64) -> None:
    """One row per task of a release group: the pieces of its effective noise scale T (from the release's record
    and the gradient-variance probe on the fixed test subsample), its individual and merged scores and the loss
    barrier to the merged model."""
    if sweep not in SWEEPS:
        raise ValueError(f"--sweep {sweep!r}: expected one of {', '.join(SWEEPS)}")
    network = backbone_from_spec(backbone_spec)
    vectors, metas = read_task_vectors(task_vectors)
    w0 = checked_w0(base, metas, task_vectors)
    tasks = load_heads_and_data(heads, data)
    own, merged_scores, barriers = _scores_by_task(individual, "individual"), _scores_by_task(merged, "merged"), \
        _barriers_by_task(interpolation)
    rows = []
    started = time.perf_counter()
    with compute_section("per-example gradient variance", log):
        for done, (vector, meta, (head, _, prepared)) in enumerate(zip(vectors, metas, tasks), start=1):
            task = prepared["task"]
            if task != meta["task"]:
                raise ValueError(f"task vector of {meta['task']!r} given with data of {task!r}; same order please")
            for name, scores in (("individual", own), ("merged", merged_scores), ("interpolation", barriers)):
                if task not in scores:
                    raise ValueError(f"the {name} file has no row for task {task!r}")
            settings = meta["hyperparameters"]
            private = bool(meta["noise_multiplier"])
            clip_norm = float(meta["clip_norm"]) if meta.get("clip_norm") is not None else None
            features, labels = fixed_test_subsample(prepared, max_examples)
            second_moment, variance, dimension = _gradient_moments(
                network, w0, vector, head, features, labels, clip_norm if private else None,
                bool(settings.get("train_head", True)))
            rate = float(meta["sample_rate"])
            pieces = effective_noise(lr=settings["lr"], weight_decay=settings["weight_decay"], steps=meta["steps"],
                                     batch_size=settings["batch_size"], sample_rate=rate,
                                     noise_multiplier=meta["noise_multiplier"], clip_norm=clip_norm,
                                     second_moment=second_moment,
                                     mean_square=mean_gradient_square(second_moment, variance, len(labels)))
            rows.append({
                **release_identity(meta), "label": label, "sweep": sweep, "task": task,
                "lr": float(settings["lr"]), "batch_size": float(settings["batch_size"]),
                "weight_decay": float(settings["weight_decay"]), "steps": int(meta["steps"]),
                "noise_multiplier": float(meta["noise_multiplier"]),
                "clip_norm": clip_norm if clip_norm is not None else float("nan"),
                "sample_rate": rate, "dimension": dimension, "gradient_second_moment": second_moment,
                "gradient_variance": variance, "num_examples": int(labels.shape[0]),
                "s_sample_bound": (sampling_noise_bound(clip_norm, settings["batch_size"], rate, dimension)
                                   if private else float("nan")),
                **pieces,
                "individual_score": own[task], "merged_score": merged_scores[task],
                "normalized_merged": merged_scores[task] / own[task] if own[task] else float("nan"),
                "barrier": barriers[task],
            })
            log(f"[noise-scale] {task}: T {pieces['noise_scale']:.3g} (DP share of variance "
                f"{pieces['dp_variance_share']:.3f}), merged - own {merged_scores[task] - own[task]:+.1f}, "
                f"barrier {barriers[task]:.4f} ({progress(done, len(tasks), started)})")
    write_parquet(rows, out)


def noise_report(*, rows: list[str], out_prefix: str, figure: list[str]) -> None:
    """The effective-noise table (PREFIX.parquet, .md, .tex: one row per setting over its seeds), its readings
    (PREFIX_readings.*: report/noise_readings.py) and figure from every group's `noise_scale` rows."""
    if not rows:
        raise ValueError("no noise-scale rows given")
    per_seed = group_summary(pd.concat([pd.read_parquet(path) for path in rows], ignore_index=True))
    settings = setting_summary(per_seed)
    write_noise_table(settings, out_prefix)
    write_readings_table(noise_readings(per_seed), f"{out_prefix}_readings")
    plot_noise_scale(settings, figure)
    log(f"[noise-report] {len(per_seed)} release groups, {len(settings)} settings -> {out_prefix}.md, "
        f"{out_prefix}_readings.md")
