"""2-D loss landscapes around a merge, App. B.4 and Figs. 4, 5 of "When Privacy Hurts Mergeability"
(arXiv 2608.26655), after Li et al., "Visualizing the Loss Landscape of Neural Nets" (arXiv 1712.09913).

- loss_landscape: every task's loss and their mean on the plane w(a, b) = w_merge + a d1 + b d2.
- filter_normalized_direction: a seeded direction d whose every filter has the norm of the same filter of w,
  d_{i,j} <- d_{i,j} ||w_{i,j}|| / ||d_{i,j}|| (Li et al., Sec. 4).
- task_vector_plane: the plane (d1, d2) = (tau_a, tau_b) of two task vectors.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dpmerge.diagnostics.common import Loss, Parameters, TaskVector
from dpmerge.runtime import progress


def filter_normalized_direction(params: Parameters, seed: int) -> Parameters:
    """A seeded Gaussian direction in parameter space, filter-normalised as in Li et al. 2018 ("Visualizing the
    loss landscape of neural nets", Sec. 4): every filter of the draw (a slice along dim 0 of a tensor with two
    or more dimensions: a conv filter, one output row of a linear layer) is rescaled to the norm of the same
    filter of `params`.

    Without the rescaling a step of given length is a large relative change for small-norm filters and a small
    one for large-norm filters, so two models whose weights differ in scale (a noisier DP model, a merge that
    shrinks or sums task vectors) would look flatter or sharper for that reason alone; filter normalisation
    makes landscapes of different models comparable.

    Tensors with at most one dimension (biases, layer-norm scales and shifts) get a zero direction, Li et al.'s
    "ignore biasbn" setting: they have no filters to normalise by (each entry would be its own one-number
    filter, moved by its own magnitude), and the norm layers' scales act on normalised activations, so their
    perturbation means something else than a filter's; the plane moves the weight matrices and filters only.

    The draw runs over tensors in name order from torch.Generator().manual_seed(seed): the same parameters and
    seed give the same direction on every machine and process.
    """
    generator = torch.Generator().manual_seed(seed)
    direction = {}
    for name in sorted(params):
        value = params[name].detach()
        if value.ndim <= 1:
            direction[name] = torch.zeros_like(value)
            continue
        draw = torch.randn(value.shape, generator=generator, dtype=torch.float64)
        draw_norms = draw.flatten(1).norm(dim=1)
        filter_norms = value.double().flatten(1).norm(dim=1)
        scale = filter_norms / draw_norms.clamp_min(torch.finfo(torch.float64).tiny)
        direction[name] = (draw * scale.view(-1, *([1] * (value.ndim - 1)))).to(value.dtype)
    return {name: direction[name] for name in params}


def task_vector_plane(task_a: TaskVector, task_b: TaskVector) -> tuple[TaskVector, TaskVector]:
    """The plane of two task vectors as landscape directions (d1, d2) = (tau_a, tau_b), unscaled: the point
    (a, b) of a landscape centred at w is w + a tau_a + b tau_b, so coordinates are multiples of the task
    vectors, the unit that merging coefficients such as task arithmetic's lambda are given in.

    Centred at task arithmetic of two tasks, w0 + lambda (tau_a + tau_b), the point (-lambda, -lambda) is w0
    and (1 - lambda, -lambda) is task a's own model w0 + tau_a; with more tasks the plane through the merge
    misses w0 and the task models."""
    if set(task_a) != set(task_b):
        raise ValueError(f"task vectors differ in tensors: {sorted(set(task_a) ^ set(task_b))[:3]}")
    for name in task_a:
        if task_a[name].shape != task_b[name].shape:
            raise ValueError(f"task vectors differ in the shape of {name!r}: {tuple(task_a[name].shape)} vs "
                             f"{tuple(task_b[name].shape)}")
    return task_a, task_b


@torch.no_grad()
def loss_landscape(losses: dict[str, Loss], centre: Parameters, d1: Parameters, d2: Parameters, coordinates_a,
                   coordinates_b, log: Callable[[str], None] | None = None) -> list[dict]:
    """Every loss at w(a, b) = centre + a d1 + b d2 on the grid coordinates_a x coordinates_b, the 2-D loss
    landscape of the paper's App. B.4 (Figs. 4, 5) after Li et al. 2018, Sec. 3; each point's mean over the
    tasks is the merged model's multi-task loss, the quantity the figures contour.

    Returns rows {"a", "b", "task", "loss"}, for a in coordinates_a, for b in coordinates_b: one row per task in
    the order of `losses`, then one row of task "mean". `log`, if given, gets one line per value of a, so a long
    grid shows its progress.
    """
    if not losses:
        raise ValueError("loss_landscape needs at least one loss")
    if "mean" in losses:
        raise ValueError("a task named 'mean' would be confused with the rows of the mean over tasks")
    for label, direction in (("d1", d1), ("d2", d2)):
        if set(direction) != set(centre):
            raise ValueError(f"direction {label} has other tensors than the centre: "
                             f"{sorted(set(direction) ^ set(centre))[:3]}")
    centre = {name: value.detach() for name, value in centre.items()}
    rows = []
    started = time.perf_counter()
    for index, a in enumerate(coordinates_a):
        a = float(a)
        means = []
        for b in coordinates_b:
            b = float(b)
            point = {name: (value + a * d1[name] + b * d2[name]).to(value.dtype) for name, value in centre.items()}
            values = {task: float(loss(point)) for task, loss in losses.items()}
            means.append(float(np.mean(list(values.values()))))
            rows.extend({"a": a, "b": b, "task": task, "loss": value} for task, value in values.items())
            rows.append({"a": a, "b": b, "task": "mean", "loss": means[-1]})
        if log is not None:
            log(f"a = {a:+.4g}: mean loss {min(means):.4g} to {max(means):.4g} "
                f"({progress(index + 1, len(coordinates_a), started)} rows)")
    return rows
