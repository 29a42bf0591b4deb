"""Interpolation from a task model to the merged model, Sec. 3.2 and Fig. 2 of "When Privacy Hurts
Mergeability" (arXiv 2608.26655).

- interpolation_curve: L_t((1 - gamma) w_t + gamma w_merge) (and the task's score) on a gamma grid.
- barrier_height: max_gamma [L(gamma) - ((1 - gamma) L(0) + gamma L(1))], the excess of the path over the
  straight line between its endpoints.
"""

from __future__ import annotations

import numpy as np
import torch

from dpmerge.diagnostics.common import TaskVector
from dpmerge.models.base import Backbone
from dpmerge.models.evaluation import evaluate_head


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
