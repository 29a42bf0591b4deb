"""Transcriptions of the reference implementations our merge operators are measured against, for
tests/test_merge_conventions.py. Each follows its source step by step, in its order of operations and dtypes
(written afresh, not copied), on plain dicts of tensors; nothing here imports dpmerge, so a test that compares
the two compares two independent computations.
"""

from __future__ import annotations

import torch


def ties_reference(task_vectors: list[dict], density: float, scaling: float, merge_func: str) -> dict:
    """TIES-merging as the TIES code runs it: prateeky2806/ties-merging src/utils/merge_utils.py
    (topk_values_mask, resolve_sign with resolve_zero_signs("majority"), disjoint_merge), called the same way by
    FusionBench's method/ties_merging/ties_merging.py (TiesMergingAlgorithm.run: state_dict_to_vector over the
    sorted keys, ties_merging, then scaling_factor * merged)."""
    keys = sorted(task_vectors[0])
    flat = torch.vstack([torch.cat([tv[k].reshape(-1) for k in keys]) for tv in task_vectors])
    # topk_values_mask(flat, K=density)
    if density > 1:
        density /= 100
    _, d = flat.shape
    kth = d - int(d * density)
    threshold = flat.abs().kthvalue(kth, dim=1, keepdim=True).values
    trimmed = flat * (flat.abs() >= threshold)
    # resolve_sign(trimmed, "mass"), whose zeros resolve_zero_signs sets to the majority sign
    sign = torch.sign(trimmed.sum(dim=0))
    sign[sign == 0] = torch.sign(sign.sum())
    # disjoint_merge(trimmed, "dis-" + merge_func, sign)
    selected = trimmed * torch.where(sign.unsqueeze(0) > 0, trimmed > 0, trimmed < 0)
    if merge_func == "mean":
        counts = (selected != 0).sum(dim=0).float()
        merged = selected.sum(dim=0) / torch.clamp(counts, min=1)
    else:
        merged = selected.sum(dim=0)
    merged = scaling * merged
    out, start = {}, 0
    for k in keys:  # vector_to_state_dict
        size = task_vectors[0][k].numel()
        out[k] = merged[start:start + size].reshape(task_vectors[0][k].shape)
        start += size
    return out


def emr_reference(task_vectors: list[dict]):
    """EMR-merging's elect, mask, rescale as emr_merge of harveyhuang18/EMR_Merging
    merge_vit/src/main_emr_merging.py (and FusionBench's method/emr_merging/utils.py, which sums where this
    averages: the same sign). Returns (unified vector, {name: [mask per task]}, rescalers); the rescalers are
    accumulated in float32 as there (torch.zeros' default dtype)."""
    count = len(task_vectors)
    unified, masks = {}, {}
    scales = torch.zeros(count)
    for name in task_vectors[0]:
        mean = torch.stack([tv[name] for tv in task_vectors], 0).mean(0)
        flag = (mean > 0) * 2 - 1  # an entry whose sum is 0 counts as negative
        largest = torch.zeros_like(task_vectors[0][name])
        masks[name] = []
        for m in range(count):
            param = task_vectors[m][name]
            mask = (param * flag) > 0
            masks[name].append(mask)
            magnitude = torch.abs(mask * param)
            largest = torch.where(magnitude > largest, magnitude, largest)
            scales[m] += torch.mean(torch.abs(param))
        unified[name] = largest * flag
    new_scales = torch.zeros(count)
    for m in range(count):
        for name in unified:
            new_scales[m] += torch.mean(torch.abs(unified[name] * masks[name][m]))
    return unified, masks, scales / new_scales


def fisher_reference(params: list[dict], fishers: list[dict], normalize_fisher_weight: bool,
                     minimal_fisher_weight: float) -> dict:
    """Fisher merging of fine-tuned parameters as FusionBench's method/fisher_merging/fisher_merging.py
    (get_models_fisher_norm, then merging_with_fisher_weights with the coefficients fisher_merging uses when
    none are given: ones(T) / T)."""
    count = len(params)
    coefficients = torch.ones(count) / count
    if normalize_fisher_weight:
        per_parameter = []
        for name in params[0]:
            stacked = torch.stack([f[name] for f in fishers], dim=0)
            per_parameter.append(torch.linalg.vector_norm(stacked, dim=list(range(1, stacked.dim()))))
        norms = torch.norm(torch.stack(per_parameter, dim=1), dim=1)
    merged = {}
    for name in params[0]:
        values = torch.stack([p[name] for p in params], dim=0)
        weights = torch.stack([f[name] for f in fishers], dim=0) + minimal_fisher_weight
        shape = (-1, *[1] * (values.dim() - 1))
        scaling = coefficients.reshape(shape)
        if normalize_fisher_weight:
            inverse = 1.0 / (norms + minimal_fisher_weight)
            scaling = scaling * (inverse / inverse.sum()).reshape(shape)
        merged[name] = (scaling * weights * values).sum(dim=0) / (scaling * weights).sum(dim=0)
    return merged


def tsvm_reference(task_vectors: list[dict], alpha: float = 1.0) -> dict:
    """TSV-Merge as compute_and_sum_svd_mem_reduction of FusionBench's
    method/task_singular_vector/utils/TSVM_utils.py (AntoAndGar/task_singular_vectors src/utils/TSVM_utils.py
    is the same, less exclude_keys and plus its "text_projection" exception), then TSVM.run's alpha."""
    count = len(task_vectors)
    sv_reduction = 1 / count
    merged = {}
    for key in task_vectors[0]:
        if task_vectors[0][key].dim() != 2:  # a running mean of every other tensor
            for i, tv in enumerate(task_vectors):
                merged[key] = tv[key].clone() if i == 0 else merged[key] + (tv[key] - merged[key]) / (i + 1)
            continue
        for i, tv in enumerate(task_vectors):
            u, s, vh = torch.linalg.svd(tv[key], full_matrices=False)
            if i == 0:
                sum_u, sum_s, sum_vh = torch.zeros_like(u), torch.zeros_like(s), torch.zeros_like(vh)
            reduced = int(s.shape[0] * sv_reduction)
            sum_u[:, i * reduced:(i + 1) * reduced] = u[:, :reduced]
            sum_s[i * reduced:(i + 1) * reduced] = s[:reduced]
            sum_vh[i * reduced:(i + 1) * reduced, :] = vh[:reduced, :]
        u_u, _, vh_u = torch.linalg.svd(sum_u, full_matrices=False)
        u_vh, _, vh_vh = torch.linalg.svd(sum_vh, full_matrices=False)
        merged[key] = torch.linalg.multi_dot((u_u, vh_u, torch.diag(sum_s), u_vh, vh_vh))
    return {key: alpha * value for key, value in merged.items()}


def ace_reference(task_vectors: list[dict], eps: float = 1e-2, k_frac: float = 0.3, normalise: bool = True,
                  use_prior: bool = True, refine: bool = True) -> dict:
    """ACE-Merging as its official code runs it: unravel-xu/ACE-Merging src/merge/strategy.py,
    MergeStrategy.ace_merging(eps=1e-2, k_frac=0.3) (commits 22d9dfe and d267001), over the keys of the first
    vector, in the order and dtypes of that code (traces through Python floats, matrices in torch's default
    dtype, inv with a pinv fallback). The three switches are the ablation of the paper's Table 4, which the
    repository has none of: normalise=False is E1 (no adaptive normalisation), use_prior=False stops before E3,
    refine=False before E4; each removes exactly the lines of its stage."""
    merged = {}
    for layer in task_vectors[0]:
        vectors = [tv[layer] for tv in task_vectors]
        if any(v.ndim != 2 or "text_projection" in layer for v in vectors):
            merged[layer] = torch.mean(torch.stack(vectors), dim=0)
            continue
        count = len(vectors)
        _, in_dim = vectors[0].shape
        traces = torch.tensor([torch.trace(w.T @ w).item() for w in vectors])
        log_traces = torch.log(traces + 1e-12)
        gamma = torch.var(log_traces) / (torch.mean(log_traces).pow(2) + 1e-12)
        flag = bool(gamma > 0.3)
        average_trace = traces.mean().item()
        sigmas = []
        weighted_sum = torch.zeros_like(vectors[0])
        sigma_sum = torch.zeros((in_dim, in_dim))
        for w in vectors:
            w = w - w.mean(dim=0, keepdim=True)
            raw = w.T @ w
            trace = torch.trace(raw) + 1e-12
            if flag and normalise:
                sigma = raw / trace
                eps_t = eps / trace
            else:
                sigma = raw
                eps_t = eps
            sigmas.append(sigma)
            sigma = sigma + eps_t * torch.eye(in_dim)
            weighted_sum += w @ sigma
            sigma_sum += sigma
        prior = torch.mean(sum(sigmas), dim=0, keepdim=True)
        if flag:
            prior = prior / (average_trace + 1e-12)
        a = sigma_sum + prior if use_prior else sigma_sum
        try:
            a_inv = torch.linalg.inv(a)
        except RuntimeError:
            a_inv = torch.linalg.pinv(a)
        w0 = weighted_sum @ a_inv
        result = w0
        if flag and refine:
            sigma_mean = sigma_sum / count
            residual = torch.zeros_like(vectors[0])
            for w, s in zip(vectors, sigmas):
                residual += w @ (s - sigma_mean)
            u, s, vh = torch.linalg.svd(residual + w0, full_matrices=False)
            k = int(s.numel() * k_frac)
            v_k = vh[:k, :].T
            result = result + s[:k].mean() * (u[:, :k] @ v_k.T)
        merged[layer] = result
    return merged
