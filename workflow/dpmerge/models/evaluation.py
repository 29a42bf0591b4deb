"""Evaluation of individual and merged models on cached trunk features, each task scored by its metric
(dpmerge/metrics.py).

Scores are reported on a 0-100 scale with each task's own metric, as GLUE tables do: accuracy, Matthews
correlation (CoLA), binary F1, the mean of binary F1 and accuracy (MRPC, QQP: GLUE reports both and its score
averages them), Spearman correlation (STS-B, a regression task). Losses are mean cross-entropy, or mean squared
error for a regression head (models/losses.py).
"""

from __future__ import annotations

import torch

from dpmerge.metrics import chance_level, score
from dpmerge.models import losses
from dpmerge.models.base import Backbone, TaskModel


@torch.no_grad()
def evaluate_head(
    backbone: Backbone,
    head: dict[str, torch.Tensor],
    features: tuple[torch.Tensor, ...],
    labels: torch.Tensor,
    metric: str,
    batch_size: int = 256,
) -> dict:
    """Loss and score of (backbone top as currently loaded) + `head` on one task's features."""
    model = TaskModel.with_head(backbone, head)
    model.eval()
    device = backbone.device
    outputs = []
    for i in range(0, labels.shape[0], batch_size):
        with backbone.autocast():
            outputs.append(model(*(f[i : i + batch_size].to(device) for f in features)).float().cpu())
    logits = torch.cat(outputs)
    return {
        "loss": float(losses.task_loss(logits, labels).item()),
        "score": score(metric, losses.predictions(logits).numpy(), labels.numpy()),
        "metric": metric,
        # what the score must beat: read by the signal check and by Table 1's normalized column
        "chance": chance_level(metric, labels.numpy()),
        "num_examples": int(labels.shape[0]),
    }
