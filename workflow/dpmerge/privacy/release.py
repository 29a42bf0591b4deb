"""Privacy decisions about what is released after fine-tuning: which task vectors may be merged together, what
(epsilon, delta) a merged model is released at, and which data may serve as public data for merge statistics.

Fine-tuning's own accounting lives in privacy/accounting.py and training/; a private statistic's composition
with its task's fine-tuning in privacy/statistics.py (`private_sample`, which records `total_epsilon`). This
module turns those records into the decisions the merge and statistics stages make.
"""

from __future__ import annotations

import json

from dpmerge.artifacts import check_privacy_record, read_metadata
from dpmerge.epsilon import epsilon_value

# A release group: task vectors of one backbone, one DP method and budget, one repetition, one w0.
RELEASE_GROUP_FIELDS = ("backbone", "method", "target_epsilon", "seed", "pretrained_sha256")


def checked_release_records(paths: list[str]) -> list[dict]:
    """Each released task vector's metadata, refused unless it carries its full privacy record.

    A file without one cannot be accounted for, so nothing derived from it (a merge) may be released either.
    Read and checked one file at a time, so the first bad file is the one named.
    """
    records = []
    for path in paths:
        record = read_metadata(path)
        check_privacy_record(record, path)
        records.append(record)
    return records


def check_release_group(records: list[dict]) -> None:
    """Refuse to merge task vectors that are not one release group (`RELEASE_GROUP_FIELDS`).

    The merged model's budget below is only meaningful for vectors trained under one method and one target
    budget from the same w0; a mixture would be filed under a budget some of its inputs were not trained at.
    """
    for key in RELEASE_GROUP_FIELDS:
        values = {json.dumps(record.get(key)) for record in records}
        if len(values) != 1:
            raise ValueError(f"task vectors disagree on {key!r}: {sorted(values)}")


def merged_release_budget(records: list[dict], statistics: dict | None = None) -> tuple:
    """(epsilon, delta) of a merged model, from its task vectors' privacy records and, for RegMean / Fisher,
    the metadata of the statistics file it read.

    Merging is post-processing of the released task vectors, and each was trained on its own task's data,
    disjoint from the others': by parallel composition the merge is (max eps_t, max delta_t)-DP. Epsilon is
    returned as recorded (a number, or "inf" for the non-private reference), chosen by its float value.

    Private statistics touch each task's training data a second time; privacy/statistics.py composes that with
    the task's fine-tuning at the task's own delta and records the total, so the merge is released at the
    largest per-task total (parallel composition again across tasks), delta unchanged. Public statistics come
    from data outside every private training set and cost nothing.
    """
    epsilon = max((record["spent_epsilon"] for record in records), key=epsilon_value)
    delta = max(float(record["delta"]) for record in records)
    if statistics is not None and statistics["source"] == "private":
        epsilon = max((record["total_epsilon"] for record in statistics["records"]), key=epsilon_value)
    return epsilon, delta


def check_public_dataset(public_task: str, private_tasks: list[str], path: str) -> None:
    """Refuse a 'public' dataset that is one of the release group's private tasks: statistics of public data are
    free only because the data lies outside every private training set."""
    if public_task in private_tasks:
        raise ValueError(f"{path} holds {public_task!r}, a private task of this release group: a private "
                         "training set is never public data")
