"""Task metrics on a 0-100 scale, one definition for the task registry (data/registry.py) and
evaluation (models/evaluation.py), and each metric's chance level. Light on purpose: numpy only, sklearn and scipy
imported when a metric needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

METRICS = ("accuracy", "balanced_accuracy", "macro_f1", "mcc", "f1", "f1_accuracy", "spearman")


def score(metric: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """Task metric on a 0-100 scale."""
    # numpy is imported here, not at the top: data/registry.py reads METRICS before any job, numpy-free.
    import numpy as np

    predictions = np.asarray(predictions)
    labels = np.asarray(labels)
    if metric == "accuracy":
        return 100.0 * float((predictions == labels).mean()) if labels.size else float("nan")
    if metric == "balanced_accuracy":
        # the mean of the per-class recalls over the classes present in the labels
        classes = np.unique(labels)
        return 100.0 * float(np.mean([(predictions[labels == c] == c).mean() for c in classes])) if labels.size \
            else float("nan")
    if metric == "macro_f1":
        from sklearn.metrics import f1_score

        return 100.0 * float(f1_score(labels, predictions, labels=np.unique(labels), average="macro",
                                      zero_division=0))
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


def chance_level(metric: str, labels: np.ndarray) -> float:
    """The best score (0-100) a predictor that ignores its input reaches on `labels` under `metric`: the larger of
    the best constant prediction's score and the expected score of guessing at random with the labels' class
    shares. Accuracy: the majority share; balanced accuracy and macro-F1: 100 / K; MCC and Spearman: 0; F1 of
    the positive class: 2p / (1 + p), always predicting positive. Computed from the test split's own labels, so
    it is the level a model must beat on exactly the examples it is scored on."""
    import numpy as np

    labels = np.asarray(labels)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known metrics: {', '.join(METRICS)}")
    if not labels.size:
        return float("nan")
    if metric == "spearman":
        return 0.0  # a constant has no ranking, and a random one correlates 0 in expectation
    classes, counts = np.unique(labels, return_counts=True)
    shares = counts / counts.sum()
    constant = max(score(metric, np.full_like(labels, c), labels) for c in classes)
    positive = float(shares[classes == 1].sum())
    stratified = {  # expected score of predictions drawn independently of the input with the labels' shares
        "accuracy": 100.0 * float((shares ** 2).sum()),
        "balanced_accuracy": 100.0 / len(classes),
        "macro_f1": 100.0 / len(classes),  # each class's precision and recall are its share: F1_k = p_k
        "mcc": 0.0,
        "f1": 100.0 * positive,
        "f1_accuracy": 50.0 * (positive + float((shares ** 2).sum())),
    }[metric]
    return max(constant, stratified)
