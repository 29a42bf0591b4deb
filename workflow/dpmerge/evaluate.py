"""Task metrics and evaluation of individual and merged models on cached trunk features.

Scores are reported on a 0-100 scale with each task's own metric (accuracy, Matthews correlation, binary F1),
as GLUE tables do. Losses are mean cross-entropy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpmerge.backbones import Backbone, TaskModel

METRICS = ("accuracy", "mcc", "f1")


def score(metric: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """Task metric on a 0-100 scale."""
    predictions = np.asarray(predictions)
    labels = np.asarray(labels)
    if metric == "accuracy":
        return 100.0 * float((predictions == labels).mean()) if labels.size else float("nan")
    if metric == "mcc":
        from sklearn.metrics import matthews_corrcoef

        return 100.0 * float(matthews_corrcoef(labels, predictions))
    if metric == "f1":
        from sklearn.metrics import f1_score

        return 100.0 * float(f1_score(labels, predictions, pos_label=1, zero_division=0))
    raise ValueError(f"unknown metric {metric!r}; known metrics: {', '.join(METRICS)}")


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
    num_classes = head["weight"].shape[0]
    model = TaskModel(backbone, num_classes)
    model.head.load_state_dict(head)
    model.eval()
    logits = torch.cat(
        [model(*(f[i : i + batch_size] for f in features)) for i in range(0, labels.shape[0], batch_size)]
    )
    return {
        "loss": float(F.cross_entropy(logits, labels).item()),
        "score": score(metric, logits.argmax(1).numpy(), labels.numpy()),
        "metric": metric,
        "num_examples": int(labels.shape[0]),
    }


def load_prepared(path: str | Path) -> dict:
    """Read a prepared task file written by `dpmerge prepare`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prepared task file not found: {path} (run the 'prepare' rule first)")
    return torch.load(path, map_location="cpu", weights_only=True)
