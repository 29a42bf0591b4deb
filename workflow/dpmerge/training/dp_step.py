"""The DP step of the paper, one equation per function ("When Privacy Hurts Mergeability", arXiv 2608.26655):

    g~ = (sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B        Eq. (4)  privatized_gradient, B = q*N expected
    eps = rho * g~ / ||g~||   (0 if ||g~|| = 0)                Eq. (5)  sam_scale (eps = scale * g~)
    h~ = g~(w + eps) on the same Poisson batch                 Eq. (6)  perturbed + sharpness_aware_query
    w <- AdamW(w, h~ + 2*lambda*(w - w0))                       Eq. (7)  add_anchor, AFTER privatization

DPSAT (Park et al., "Differentially Private Sharpness-Aware Training", ICML 2023) moves Eq. (5)'s ascent to the
previous step's privatized gradient, so each step makes one query instead of two:

    eps_t = rho * g~_{t-1} / ||g~_{t-1}||   (0 at the first step)                previous_step_query
    g~_t  = g~(w_t + eps_t), one query; w <- AdamW(w, g~_t [+ 2*lambda*(w - w0)])

The Poisson batch and the clipping factor are privacy/gaussian_mechanism.py's. The methods are one-line step
functions (`STEPS`, called through method_update): nonprivate (plain gradient), naive_dp (Eq. 4), dp_merging (Eq. 4-7),
dp_sam (w/o alignment:
lambda = 0), dp_anchor (w/o flatness: anchor on one query per step), dp_sat and dp_sat_anchor (DPSAT without
and with the anchor). A step function receives the run's `memory` (a dict the loop keeps and checkpoints), where
DPSAT keeps g~_{t-1}. Per-example clipped gradient sums come
from training/persample.py (Opacus vmap/hooks or our one-backward book-keeping, identical results); noise, the
SAM perturbation and the anchor are done here, so each of the two DP-SAM queries is visible and accounted (see
privacy/accounting.py). Normalising by the expected batch size (not the realised one) keeps the normaliser
data-independent, as Opacus does.
"""

from __future__ import annotations

import contextlib

import torch

from dpmerge.methods import Method


def clipped_gradient_sum(clipper, features: tuple[torch.Tensor, ...], labels: torch.Tensor, clip_norm: float,
                         into: list[torch.Tensor] | None = None, scale: float = 1.0):
    """scale * sum_i clip_C(grad l(w; z_i)) over the batch, one tensor per trainable parameter (see
    training/persample.py), added onto `into` (one tensor per parameter, in place) where given."""
    return clipper.clipped_sum(features, labels, clip_norm, into=into, scale=scale)


def privatized_gradient(
    clipper,
    features: tuple[torch.Tensor, ...],
    labels: torch.Tensor,
    *,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch_size: float,
    noise,
    extra_examples=None,
) -> list[torch.Tensor]:
    """Eq. (4): g~ = (sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B. One query of the Gaussian mechanism.

    `noise` is a secret stream (privacy/randomness.py: `normal_(tensors, std)` overwrites them with std * N(0, I)),
    never a publicly seeded one. `extra_examples(summed, scale)` adds scale times the clipped gradients of examples
    that are not data (an audit's canaries, training/canaries.py) to the sum, as the examples' own.
    """
    # The noise N(0, (sigma C / B)^2 I) is drawn first, straight into the gradient's own tensors (no temporary,
    # spread over the stream's generators and threads), and the clipped sums, their clip factors times 1 / B, are
    # added onto it by the products that compute them (a GEMM with beta = 1). Drawing into fresh tensors, adding
    # them to the sums and dividing by B cost two passes over the model of their own. The noise does not depend
    # on the data, so when it is drawn changes nothing.
    scale = 1.0 / float(expected_batch_size)
    summed = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in clipper.params]
    noise.normal_(summed, noise_multiplier * clip_norm * scale)
    clipped_gradient_sum(clipper, features, labels, clip_norm, into=summed, scale=scale)
    if extra_examples is not None:
        extra_examples(summed, scale)
    return summed


def sam_scale(gradient: list[torch.Tensor], rho: float) -> float:
    """Eq. (5) as a scale: eps = rho * g / ||g||_2 = scale * g, and 0 when ||g|| = 0. Post-processing of g: no
    privacy cost. eps itself is never materialised: perturbed() adds scale * g to the weights in one pass."""
    norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gradient))))
    return rho / norm if norm > 0 else 0.0


@contextlib.contextmanager
def perturbed(params: list[torch.Tensor], direction: list[torch.Tensor], scale: float = 1.0):
    """Temporarily move the weights to w + scale * direction (one fused pass into fresh storage). Restored
    bit-exactly and for free: the parameters get their original storage back, never a recomputed
    (w + eps) - eps, which differs from w in floats."""
    if scale == 0:
        yield
        return
    with torch.no_grad():
        originals = [p.data for p in params]
        for p, shifted in zip(params, torch._foreach_add(originals, direction, alpha=scale)):
            p.data = shifted
    try:
        yield
    finally:
        with torch.no_grad():
            for p, original in zip(params, originals):
                p.data = original


def add_anchor(update, params, anchors, anchor_lambda: float, *, in_place: bool = True):
    """Eq. (7)'s alignment term: update + 2 lambda (w - w0), added to the already privatized update (in place,
    or into new tensors where the update must stay as it is: DPSAT remembers it for the next step).

    Never through the loss: Opacus would drop it, and here it would be clipped away with the data terms.
    Parameters without a pretrained value (the task head) have no anchor.
    """
    with torch.no_grad():
        anchored = [i for i, w0 in enumerate(anchors) if w0 is not None]
        if not anchored:
            return update
        u = [update[i] for i in anchored]
        drift = torch._foreach_sub([params[i] for i in anchored], [anchors[i] for i in anchored])
        if in_place:
            torch._foreach_add_(u, drift, alpha=2.0 * anchor_lambda)
            return update
        update = list(update)
        for i, value in zip(anchored, torch._foreach_add(u, drift, alpha=2.0 * anchor_lambda)):
            update[i] = value
    return update


def sharpness_aware_query(query, params, features, labels, rho: float):
    """DP-SAM's two queries on the same Poisson batch: g~ at w, then h~ at w + rho g~/||g~|| (Eq. 4-6)."""
    g = query(features, labels)  # Eq. (4) at w
    with perturbed(params, g, sam_scale(g, rho)):  # Eq. (5): post-processing of g~
        return query(features, labels)  # Eq. (6): at w + eps, same batch


def previous_step_query(query, params, features, labels, rho: float, memory: dict):
    """DPSAT's one query: g~ at w + rho g~_{t-1}/||g~_{t-1}|| (at w on the first step), remembered for the next step.

    g~_{t-1} was privatized when it was made, so reusing it is post-processing: the step costs one query.
    The returned tensors are the remembered ones (no copy): the caller must not change them in place (the
    anchor goes on out of place; AdamW only reads gradients).
    """
    previous = memory.get("previous_gradient")
    if previous is None:
        gradient = query(features, labels)
    else:
        with perturbed(params, previous, sam_scale(previous, rho)):
            gradient = query(features, labels)
    memory["previous_gradient"] = gradient
    return gradient


# One function per method of dpmerge/methods.py: the direction handed to AdamW for one step. `query(features,
# labels)` is the gradient oracle: Eq. (4)'s privatized gradient for private methods (each call one accounted
# query; the method's queries_per_step must match, tested), the plain mini-batch gradient for `nonprivate`.
# `memory` persists across the run's steps (and its checkpoints). The keyword arguments are exactly the method's
# `hyperparameters` (tested), passed by name.


def nonprivate_step(query, params, anchors, features, labels, memory):
    return query(features, labels)


def naive_dp_step(query, params, anchors, features, labels, memory):
    return query(features, labels)  # Eq. (4), then AdamW


def dp_merging_step(query, params, anchors, features, labels, memory, *, rho, anchor_lambda):
    h = sharpness_aware_query(query, params, features, labels, rho)  # Eq. (4)-(6)
    return add_anchor(h, params, anchors, anchor_lambda)  # Eq. (7)


def dp_sam_step(query, params, anchors, features, labels, memory, *, rho):
    return sharpness_aware_query(query, params, features, labels, rho)  # w/o alignment (lambda = 0)


def dp_anchor_step(query, params, anchors, features, labels, memory, *, anchor_lambda):
    return add_anchor(query(features, labels), params, anchors, anchor_lambda)  # w/o flatness (rho = 0)


def dp_sat_step(query, params, anchors, features, labels, memory, *, rho):
    return previous_step_query(query, params, features, labels, rho, memory)  # DPSAT


def dp_sat_anchor_step(query, params, anchors, features, labels, memory, *, rho, anchor_lambda):
    g = previous_step_query(query, params, features, labels, rho, memory)
    return add_anchor(g, params, anchors, anchor_lambda, in_place=False)  # DPSAT + Eq. (7)'s anchor; g stays g~


STEPS = {
    "nonprivate": nonprivate_step,
    "naive_dp": naive_dp_step,
    "dp_sam": dp_sam_step,
    "dp_anchor": dp_anchor_step,
    "dp_merging": dp_merging_step,
    "dp_sat": dp_sat_step,
    "dp_sat_anchor": dp_sat_anchor_step,
    "pretrained_head": naive_dp_step,  # Eq. (4) on the head's parameters alone
}


def adamw(params: list, *, lr: float, weight_decay: float = 1e-2,
          betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """The optimizer of Eq. (7) and of every method. torch's fused kernel where it has one for the parameters'
    device (CPU, CUDA): one pass over each parameter instead of about ten multi-tensor passes, 4-5 x faster on the
    CPU, which is a tenth of a non-private step on an embedded top at batch 16 (bench/dp_step.py). Same algorithm;
    the updates differ from the multi-tensor kernel's only in float rounding."""
    # `params`: tensors, or param groups (dicts with their own lr, e.g. finetune.head_lr's)
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in tensors)
    # None, not False, elsewhere: fused=False would also switch off torch's multi-tensor default
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, fused=fused or None)


def method_update(method: Method, query, params, anchors, features, labels, memory: dict | None = None,
                  **settings):
    """The direction handed to AdamW for one step of `method` (dispatches to its step function with the
    method's hyperparameters taken by name from `settings`, e.g. rho=..., anchor_lambda=...; others are ignored).
    `memory`: the run's state across steps (None: a fresh one, i.e. a first step)."""
    missing = [name for name in method.hyperparameters if name not in settings]
    if missing:
        raise TypeError(f"method {method.name} needs {', '.join(missing)}")
    return STEPS[method.name](query, params, anchors, features, labels, {} if memory is None else memory,
                              **{name: settings[name] for name in method.hyperparameters})
