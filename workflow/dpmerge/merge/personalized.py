"""Personalized merges, one light model per task: EMR, TALL masks and DTS; and consensus task arithmetic,
which uses the same TALL masks to make one shared model.

A personalized rule returns (shared tensor, [parts of task t]); its layout `<name>_layout(shape, dtype,
**hyper)` gives each part's (dtype, shape) and `<name>_reconstruct(shared, parts, **hyper)` rebuilds task t's
vector at evaluation (merge.registry stores the parts and calls these).

- EMR-merging: Huang et al., arXiv 2405.17461 (NeurIPS 2024): an elected unified vector, per task a mask and a
  rescaler. By default as the paper writes it; `rescale: per_tensor` with `zero_sign: negative` is emr_merge of
  its code (harveyhuang18/EMR_Merging merge_vit/src/main_emr_merging.py, the same in FusionBench's
  method/emr_merging/utils.py).
- TALL masks and consensus task arithmetic: Wang et al., arXiv 2405.07813 (ICML 2024).
- DTS: Guo et al., arXiv 2512.01461: per task a truncated SVD with 2-bit four-group codes (`dts_quantize` /
  `dts_dequantize`); DTS-T on task vectors, DTS-D on difference vectors.
"""

from __future__ import annotations

import torch

from dpmerge.merge.matrices import matrix_view, sum_of
from dpmerge.merge.sources import VectorSource

# ---- TALL masks: one per task (tall_masks), or their consensus (consensus_ta)


def tall_masks(tensors: list[torch.Tensor], tall_mask_lambda: float, summed: torch.Tensor | None = None):
    """TALL masks (Wang et al., 2024), one per task, made lazily: entry j matters to task t if
    |tau_t| > lambda |tau_MTL - tau_t|, with tau_MTL = sum_t tau_t, i.e. the task's own update outweighs what the
    multi-task vector adds on top of it."""
    summed = sum_of(tensors) if summed is None else summed
    return (t.abs() > tall_mask_lambda * (summed - t).abs() for t in tensors)


def _consensus_tensor(key, tensors, stats, scaling, tall_mask_lambda, min_agreement):
    """Consensus task arithmetic (Wang et al., 2024, "Localizing Task Information for Improved Model Merging
    and Compression", arXiv 2405.07813): task arithmetic restricted to the entries that at least
    `min_agreement` tasks' TALL masks select (k = 2 in the paper), removing "selfish" (one task) and
    "catastrophic" (no task) weights.

    Args:
        scaling: task arithmetic's lambda (the same default as task_arithmetic's).
        tall_mask_lambda: the TALL mask threshold (the paper picks it per task on validation data from
            {0.2, ..., 0.6}; data-free, one value for all, FusionBench's TALL default 0.6).
        min_agreement: k."""
    summed = sum_of(tensors)
    agreement = torch.zeros(summed.shape, dtype=torch.int32)
    for mask in tall_masks(tensors, tall_mask_lambda, summed):  # one task's temporaries at a time
        agreement += mask
    return scaling * torch.where(agreement >= min_agreement, summed, torch.zeros_like(summed))


def _tall_tensor(key, tensors, stats, tall_mask_lambda):
    summed = sum_of(tensors)
    return summed, [{"mask": m.to(torch.uint8)} for m in tall_masks(tensors, tall_mask_lambda, summed)]


def _mask_reconstruct(shared, parts, **_):
    return parts["mask"].to(shared.dtype) * shared


def _mask_layout(shape, dtype, **_):
    return {"mask": (torch.uint8, tuple(shape))}


# ---- EMR-merging


def _emr_statistics(source: VectorSource, rescale, zero_sign):
    """Per-task rescalers lambda_t = sum|tau_t| / sum|M_t * tau_uni| (streamed), the sums over the whole vector
    (`whole_vector`, the paper's formula: the rescaled masked vector keeps tau_t's L1 norm), or over tensors of
    each tensor's mean (`per_tensor`, emr_merge of the EMR code: sum_n mean|tau_t,n| / sum_n
    mean|M_t,n * tau_uni,n|, which weights a small tensor's entries more than a large one's; the two agree when
    every tensor has the same size, issue 19 measured up to 2 % apart on real task vectors). 0 where nothing of
    tau_uni survives a task's mask (the code divides by 0 there)."""
    own = torch.zeros(len(source), dtype=torch.float64)
    kept = torch.zeros(len(source), dtype=torch.float64)
    for key in source.keys():
        tensors = source.tensors(key)
        unified, masks = _emr_unified(tensors, zero_sign)
        reduce = torch.mean if rescale == "per_tensor" else torch.sum
        own += torch.stack([reduce(t.double().abs()) for t in tensors])
        kept += torch.stack([reduce((unified * m).double().abs()) for m in masks])
    return [float(o / k) if k > 0 else 0.0 for o, k in zip(own, kept)]


def _emr_unified(tensors, zero_sign):
    """EMR's elect step: sign of the sum, then per entry the largest |tau_t| among tasks of that sign; masks
    M_t = (tau_t * tau_uni > 0). Where the sum is exactly 0 the elected sign is 0 (`none`, the paper's
    sgn(sum): nothing kept there) or, as the EMR code's (sum > 0) * 2 - 1, negative (`negative`: the largest
    negative entry kept)."""
    summed = sum_of(tensors)
    if zero_sign == "negative":
        sign = torch.where(summed > 0, 1.0, -1.0).to(summed.dtype)
    else:
        sign = torch.sign(summed)
    magnitude = torch.zeros_like(sign)
    for t in tensors:  # one task's temporaries at a time
        magnitude = torch.maximum(magnitude, torch.where(torch.sign(t) == sign, t.abs(), torch.zeros_like(t)))
    unified = sign * magnitude
    return unified, (t * unified > 0 for t in tensors)


def _emr_tensor(key, tensors, rescalers, rescale, zero_sign):
    unified, masks = _emr_unified(tensors, zero_sign)
    parts = [{"mask": m.to(torch.uint8), "scale": torch.tensor(r, dtype=tensors[0].dtype)}
             for m, r in zip(masks, rescalers)]
    return unified, parts


def _emr_layout(shape, dtype, **_):
    return {"mask": (torch.uint8, tuple(shape)), "scale": (dtype, ())}


def _emr_reconstruct(shared, parts, **_):
    return parts["scale"] * parts["mask"].to(shared.dtype) * shared


# ---- DTS: per task, truncated SVD (a fraction r of the singular values) with 2-bit codes for U and V: sign, and
# above/below the median magnitude of that sign; each of the four groups is decoded as its mean |value|.


def _dts_rank(shape, rank_fraction):
    return max(1, int(round(rank_fraction * min(shape[0], int(torch.Size(shape[1:]).numel())))))


def _dts_layout(shape, dtype, rank_fraction, include_conv):
    if len(shape) == 2 or (include_conv and len(shape) == 4):
        rows, cols = shape[0], int(torch.Size(shape[1:]).numel())
        k = _dts_rank(shape, rank_fraction)
        return {"u_codes": (torch.uint8, (rows, k)), "u_scales": (dtype, (4,)), "s": (dtype, (k,)),
                "v_codes": (torch.uint8, (k, cols)), "v_scales": (dtype, (4,))}
    return {"codes": (torch.uint8, tuple(shape)), "scales": (dtype, (4,))}


def dts_quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """2-bit codes (0/1: positive small/large, 2/3: negative small/large, split at the median magnitude of each
    sign) and the four groups' mean |value| (the L2-optimal scale of each group)."""
    flat = values.reshape(-1)
    codes = torch.zeros(flat.shape, dtype=torch.uint8)
    scales = torch.zeros(4, dtype=values.dtype)
    for base, chosen in ((0, flat > 0), (2, flat < 0)):
        magnitudes = flat[chosen].abs()
        if magnitudes.numel() == 0:
            continue
        large = magnitudes > magnitudes.median()
        group = torch.full(magnitudes.shape, base, dtype=torch.uint8) + large.to(torch.uint8)
        codes[chosen] = group
        for offset in (0, 1):
            members = magnitudes[group == base + offset]
            if members.numel():
                scales[base + offset] = members.mean()
    codes[flat == 0] = 0  # zeros decode to the smallest positive group: 2 bits cannot say "zero"
    return codes.reshape(values.shape), scales


def dts_dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    signs = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=scales.dtype)
    return (signs * scales)[codes.long()]


def _dts_tensor(key, tensors, stats, rank_fraction, include_conv):
    parts = []
    for t in tensors:
        matrix = matrix_view(t, include_conv)
        if matrix is None:
            codes, scales = dts_quantize(t)
            parts.append({"codes": codes, "scales": scales})
            continue
        k = _dts_rank(t.shape, rank_fraction)
        u, s, vh = torch.linalg.svd(matrix.float(), full_matrices=False)
        u_codes, u_scales = dts_quantize(u[:, :k])
        v_codes, v_scales = dts_quantize(vh[:k])
        dtype = t.dtype
        parts.append({"u_codes": u_codes, "u_scales": u_scales.to(dtype), "s": s[:k].to(dtype),
                      "v_codes": v_codes, "v_scales": v_scales.to(dtype)})
    return torch.zeros_like(tensors[0]), parts


def _dts_reconstruct(shared, parts, rank_fraction, include_conv):
    if "codes" in parts:
        return shared + dts_dequantize(parts["codes"], parts["scales"])
    u = dts_dequantize(parts["u_codes"], parts["u_scales"])
    vh = dts_dequantize(parts["v_codes"], parts["v_scales"])
    return shared + ((u * parts["s"]) @ vh).reshape(shared.shape)


# What merge.registry pairs with each name's OperatorSpec.
IMPLEMENTATIONS = {
    "emr": {"per_tensor": _emr_tensor, "statistics": _emr_statistics, "parts_layout": _emr_layout,
            "reconstruct": _emr_reconstruct},
    "tall_masks": {"per_tensor": _tall_tensor, "parts_layout": _mask_layout,
                   "reconstruct": _mask_reconstruct},
    "dts": {"per_tensor": _dts_tensor, "parts_layout": _dts_layout,
            "reconstruct": _dts_reconstruct},
    "consensus_ta": {"per_tensor": _consensus_tensor},
}
