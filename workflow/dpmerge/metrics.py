"""Task metrics on a 0-100 scale, one definition for the task registry (data/registry.py) and
evaluation (models/evaluation.py). Light on purpose: numpy only, sklearn and scipy imported when a metric needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

METRICS = ("accuracy", "mcc", "f1", "f1_accuracy", "spearman")


def score(metric: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """Task metric on a 0-100 scale."""
    # numpy is imported here, not at the top: data/registry.py reads METRICS before any job, numpy-free.
    import numpy as np

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
    if metric == "f1_accuracy":
        return (score("f1", predictions, labels) + score("accuracy", predictions, labels)) / 2
    if metric == "spearman":
        from scipy.stats import spearmanr

        if labels.size < 2 or np.ptp(predictions) == 0:
            return 0.0  # constant predictions carry no ranking (spearmanr would return nan)
        return 100.0 * float(spearmanr(predictions, labels).statistic)
    raise ValueError(f"unknown metric {metric!r}; known metrics: {', '.join(METRICS)}")
