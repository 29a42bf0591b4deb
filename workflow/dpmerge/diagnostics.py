"""Geometric diagnostics of private mergeability (paper, Sec. 3.2).

- reference_drift: Drift = (1/T) sum_t ||w_t - w0||_2 / ||w0||_2 over the merged (top) parameters (Fig. 3b).
- interpolation_curve: L_t((1 - gamma) w_t + gamma w_merge) on a gamma grid (Fig. 2), with the barrier
  height max_gamma [L(gamma) - ((1 - gamma) L(0) + gamma L(1))], the excess over the straight line.
"""

from __future__ import annotations

import numpy as np
import torch

from dpmerge.backbones import Backbone
from dpmerge.evaluate import evaluate_head

TaskVector = dict[str, torch.Tensor]


def _global_norm(tensors: TaskVector) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors.values())))


def reference_drift(pretrained: TaskVector, task_vectors: list[TaskVector]) -> tuple[float, list[float]]:
    """Return (mean drift, per-task ||tau_t|| / ||w0||)."""
    base = _global_norm(pretrained)
    if base == 0:
        raise ValueError("pretrained weights have zero norm; drift is undefined")
    per_task = [_global_norm(tv) / base for tv in task_vectors]
    return float(np.mean(per_task)), per_task


def barrier_height(gammas: np.ndarray, losses: np.ndarray) -> float:
    """Largest excess of the loss path over the straight line between its endpoints."""
    line = (1 - gammas) * losses[0] + gammas * losses[-1]
    return float(np.max(losses - line))


@torch.no_grad()
def interpolation_curve(
    backbone: Backbone,
    pretrained: TaskVector,
    task_vector: TaskVector,
    merged_vector: TaskVector,
    head: dict[str, torch.Tensor],
    features: tuple[torch.Tensor, ...],
    labels: torch.Tensor,
    metric: str,
    gammas: np.ndarray,
) -> list[dict]:
    """Loss and score along w(gamma) = (1 - gamma) w_t + gamma w_merge, with task t's head throughout."""
    rows = []
    for gamma in gammas:
        state = {
            name: pretrained[name] + (1 - gamma) * task_vector[name] + gamma * merged_vector[name]
            for name in pretrained
        }
        backbone.load_top_state(state)
        result = evaluate_head(backbone, head, features, labels, metric)
        rows.append({"gamma": float(gamma), "loss": result["loss"], "score": result["score"]})
    backbone.load_top_state(pretrained)
    return rows
