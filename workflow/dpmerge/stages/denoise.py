"""Denoised releases: `dpmerge denoise` takes one released task vector and writes its denoised version
(merge/denoise.py), computed from the vector alone. Under DP that is post-processing of the release: the output
keeps the release's record unchanged (its epsilon, delta and the rest), says what it is a function of
(`post_processing_of`: the operation and the release's tensor hash, which the ledger matches against the release
it holds) and carries what denoising found per tensor (`denoised`: noise level, kept rank, energy kept).
"""

from __future__ import annotations

import time

import pandas as pd

from dpmerge.artifacts import (
    POST_PROCESSING,
    PRIVACY_FIELDS,
    check_privacy_record,
    load_tensors,
    read_metadata,
    save_tensors,
    tensors_sha256,
)
from dpmerge.merge.denoise import check_denoiser, denoise_vector
from dpmerge.report import denoise_study
from dpmerge.runtime import progress
from dpmerge.stages.common import log


def _progress_logger(every_seconds: float = 10.0):
    started = last = time.perf_counter()

    def report(done: int, total: int) -> None:
        nonlocal last
        now = time.perf_counter()
        if done == total or now - last >= every_seconds:
            log(f"[denoise] tensor {progress(done, total, started)}")
            last = now

    return report


def denoise(*, task_vector: str, method: str, out: str) -> dict:
    """Write the denoised `task_vector` to `out`; returns the summary stored in its metadata. A release keeps its
    record; a plain task vector (no record) is denoised too and stays plain. Heads are not denoised (they are not
    merged), nor is a vector denoised twice."""
    check_denoiser(method)
    tensors, meta = load_tensors(task_vector)
    if meta.get("artifact") not in (None, "task_vector"):
        raise ValueError(f"{task_vector} is a {meta['artifact']}, not a task vector: only task vectors are denoised")
    if POST_PROCESSING in meta:
        raise ValueError(f"{task_vector} is already a post-processing of a release "
                         f"({meta[POST_PROCESSING].get('operation')}); denoise the release it came from")
    released = any(field in meta for field in PRIVACY_FIELDS)
    if released:
        check_privacy_record(meta, task_vector)
    if not tensors:
        raise ValueError(f"{task_vector} holds no tensors")
    parent = tensors_sha256(tensors)
    denoised, summary = denoise_vector(tensors, method, on_tensor=_progress_logger())
    metadata = {**meta, "denoised": summary,
                POST_PROCESSING: {"operation": "denoise", "method": method, "tensors_sha256": parent}}
    save_tensors(out, denoised, metadata)
    spectral = [r for r in summary["tensors"].values() if r["how"] == "spectral"]
    kept = sum(r["kept_rank"] > 0 for r in spectral)
    log(f"[denoise] {method}: {len(tensors)} tensors, {len(spectral)} matrices read against the noise floor, "
        f"{kept} with a direction above it; pooled noise level {summary['pooled_noise_level']:.3g} "
        f"({summary['pooled_from']})" + ("; the release's record kept (post-processing, no new budget)"
                                         if released else ""))
    return summary


def denoise_report(*, scores: list[str], pretrained: list[str], vectors: list[str], pairs: list[str],
                   out_prefix: str, figure: list[str]) -> None:
    """The denoised-releases study: PREFIX.* (each pair of merge entries, denoised and not, on naive-DP and
    DP-Merging releases per budget, the Pretrained row, the readings paired by seed), PREFIX_noise.* (what
    denoising found in the releases, from the denoised vectors' metadata) and the figure."""
    if not scores or not vectors:
        raise ValueError("denoise-report needs --scores and --vectors files")
    pairing = denoise_study.parse_pairs(pairs)
    score_rows = denoise_study.score_summary(pd.concat([pd.read_parquet(p) for p in scores], ignore_index=True),
                                             pd.concat([pd.read_parquet(p) for p in pretrained], ignore_index=True)
                                             if pretrained else None, pairing)
    noise_rows = denoise_study.noise_summary([read_metadata(path) for path in vectors])
    denoise_study.write_tables(score_rows, noise_rows, out_prefix)
    denoise_study.plot_denoise_study(score_rows, figure)
    log(f"[denoise-report] {len(score_rows)} score rows, {len(noise_rows)} noise rows -> {out_prefix}.md, "
        f"{out_prefix}_noise.md")
