"""Reference drift, Sec. 3.2 and Fig. 3b of "When Privacy Hurts Mergeability" (arXiv 2608.26655).

- reference_drift: Drift = (1/T) sum_t ||w_t - w0||_2 / ||w0||_2 over the merged (top) parameters.
"""

from __future__ import annotations

import numpy as np
import torch

from dpmerge.diagnostics.common import TaskVector


def _global_norm(tensors: TaskVector) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors.values())))


def reference_drift(pretrained: TaskVector, task_vectors: list[TaskVector]) -> tuple[float, list[float]]:
    """Return (mean drift, per-task ||tau_t|| / ||w0||)."""
    base = _global_norm(pretrained)
    if base == 0:
        raise ValueError("pretrained weights have zero norm; drift is undefined")
    per_task = [_global_norm(tv) / base for tv in task_vectors]
    return float(np.mean(per_task)), per_task
