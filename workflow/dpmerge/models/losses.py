"""The training loss and the predictions of a task head, for classification and regression heads alike.

A head with one output is a regression head (GLUE's STS-B: a similarity score in [0, 5]) and is trained with the
squared error; a head with two or more outputs is a classifier trained with cross-entropy. Every place that
needs a loss (the DP queries, the progress log, evaluation, curvature) calls `task_loss`, so a regression task
goes through the same private step as a classification task.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """bfloat16/float16 -> float32; float32/float64 and integer tensors unchanged (no copy)."""
    if tensor.is_floating_point() and torch.finfo(tensor.dtype).bits < 32:
        return tensor.float()
    return tensor


def is_regression(outputs: torch.Tensor) -> bool:
    return outputs.shape[-1] == 1


def task_loss(outputs: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy for class labels, squared error for a one-output regression head."""
    if is_regression(outputs):
        outputs = at_least_float32(outputs.squeeze(-1))
        return F.mse_loss(outputs, labels.to(outputs.dtype), reduction=reduction)
    return F.cross_entropy(at_least_float32(outputs), labels.long(), reduction=reduction)


def predictions(outputs: torch.Tensor) -> torch.Tensor:
    """Predicted class indices, or the predicted scores of a regression head."""
    return at_least_float32(outputs.squeeze(-1)) if is_regression(outputs) else outputs.argmax(-1)
