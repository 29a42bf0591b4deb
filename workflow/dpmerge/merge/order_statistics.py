"""Exact order statistics over whole task vectors, streamed, and the magnitude thresholds built on them.

Global top-k (TIES-Merging, Yadav et al., "TIES-Merging: Resolving Interference When Merging Models", arXiv
2306.01708) and quantile clamps (PCB-merging, Du et al., "Parameter Competition Balancing for Model Merging",
arXiv 2410.02396) need ranks over every entry of a task vector, which is too large to sort in memory for the
large backbones. `streamed_order_statistics` finds them exactly by radix selection over two streamed passes;
`top_magnitude_threshold` is the in-memory version for one tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from dpmerge.merge.sources import VectorSource


def threshold_rank(numel: int, density: float, rule: str) -> int:
    """0-based rank, from the smallest |v|, of the threshold that keeps the top `density` of `numel` entries
    (every entry with |v| >= it, ties at it included); -1 keeps every entry, `numel` none.

    "round" keeps k = round(density * numel) entries. "reference" is topk_values_mask of the TIES code
    (prateeky2806/ties-merging src/utils/merge_utils.py, copied into FusionBench's ties_merging_utils.py):
    k = int(density * numel) and the threshold is kthvalue(numel - k) (1-based), which keeps k + 1 entries when
    magnitudes are distinct, one even at density 0 (density 1 is refused by merge.checks: kthvalue(0) fails).
    """
    if rule == "reference":
        return numel - int(numel * density) - 1
    k = int(round(density * numel))
    if k >= numel:
        return -1
    if k <= 0:
        return numel
    return numel - k


def fixed_threshold(rank: int, numel: int) -> float | None:
    """The |v| threshold where threshold_rank's `rank` needs no order statistic, else None."""
    if rank < 0:
        return 0.0  # keep everything (|v| >= 0)
    if rank >= numel:
        return float("inf")  # keep nothing
    return None


def top_magnitude_threshold(values: torch.Tensor, density: float, rule: str = "round") -> float:
    """|v| threshold keeping the `density` fraction of largest-magnitude entries (ties at it kept), by
    threshold_rank's `rule`."""
    rank = threshold_rank(values.numel(), density, rule)
    fixed = fixed_threshold(rank, values.numel())
    return fixed if fixed is not None else float(values.abs().kthvalue(rank + 1).values)


def task_magnitudes(source: VectorSource):
    """Chunks for streamed_order_statistics: per tensor name, every task's |tau|, one task read at a time."""
    for key in source.keys():
        yield (source.tensor(index, key).abs() for index in range(len(source)))


def total_numel(source: VectorSource) -> int:
    """Entries of one task vector, over all its tensors."""
    return sum(torch.Size(source.shape(key)).numel() for key in source.keys())


def _order_keys(values: torch.Tensor) -> torch.Tensor:
    """float32 values -> int64 keys in [0, 2^32) with the same order (negative floats' bits reversed)."""
    bits = values.detach().to(torch.float32).reshape(-1).view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -1 - bits, bits + (1 << 31))


def _key_value(key: int) -> float:
    bits = key - (1 << 31) if key >= 1 << 31 else -1 - key
    return float(torch.tensor([bits], dtype=torch.int32).view(torch.float32))


_PIECE = 1 << 20  # keys are formed a million values at a time, bounding the int64 temporaries


def streamed_order_statistics(read_chunks: Callable[[], Iterator], ranks: list[list[int]]):
    """Exact order statistics of S value sequences too large to hold, read twice in chunks.

    `read_chunks()` yields, chunk after chunk, S tensors (a list or a lazy iterable: the next piece of every
    sequence, in sequence order); it is called twice and must yield the same values both times. `ranks[s]`
    lists 0-based ranks from the smallest wanted in sequence s; returns the values at those ranks, as sorting
    the whole sequence would give.

    Radix selection on order-preserving 32-bit keys of the float32 values: the first pass histograms the high 16
    bits and finds the bucket of every wanted rank, the second histograms the low 16 bits inside those buckets.
    Memory: one chunk plus 2^16 counters per sequence and wanted bucket.
    """
    size = 1 << 16
    high = torch.zeros(len(ranks), size, dtype=torch.int64)
    for chunk in read_chunks():
        for s, values in enumerate(chunk):
            for piece in values.reshape(-1).split(_PIECE):
                high[s] += torch.bincount(_order_keys(piece) >> 16, minlength=size)
    wanted = []  # per sequence: (bucket, rank within the bucket) per rank
    for s, sequence_ranks in enumerate(ranks):
        cumulative = high[s].cumsum(0)
        total = int(cumulative[-1])
        row = []
        for rank in sequence_ranks:
            if not 0 <= rank < total:
                raise ValueError(f"rank {rank} outside a sequence of {total} values")
            bucket = int(torch.searchsorted(cumulative, torch.tensor(rank + 1)))
            row.append((bucket, rank - (int(cumulative[bucket - 1]) if bucket else 0)))
        wanted.append(row)
    low = {(s, bucket): torch.zeros(size, dtype=torch.int64) for s, row in enumerate(wanted) for bucket, _ in row}
    for chunk in read_chunks():
        for s, values in enumerate(chunk):
            for piece in values.reshape(-1).split(_PIECE):
                keys = _order_keys(piece)
                for bucket in {b for b, _ in wanted[s]}:
                    low[s, bucket] += torch.bincount(keys[(keys >> 16) == bucket] & 0xFFFF, minlength=size)
    return [
        [_key_value((bucket << 16) | int(torch.searchsorted(low[s, bucket].cumsum(0), torch.tensor(rank + 1))))
         for bucket, rank in row]
        for s, row in enumerate(wanted)
    ]
