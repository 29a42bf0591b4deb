"""Geometric diagnostics of private mergeability (paper, Sec. 3.2).

- reference_drift: Drift = (1/T) sum_t ||w_t - w0||_2 / ||w0||_2 over the merged (top) parameters (Fig. 3b).
- interpolation_curve: L_t((1 - gamma) w_t + gamma w_merge) on a gamma grid (Fig. 2), with the barrier
  height max_gamma [L(gamma) - ((1 - gamma) L(0) + gamma L(1))], the excess over the straight line.

On any differentiable loss given as a function of a parameter mapping (name -> tensor):
- sharpness_proxy: Sharp_t(w_t; rho) = L_t(w_t + rho grad/||grad||) - L_t(w_t) (Sec. 3.2, Fig. 3a).
- hessian_max_eigenvalue: lambda_max(H_t) by power iteration on Hessian-vector products (Eq. 3).
- merge_gap_bound: Theorem 5.2 / C.4 from measured quantities, ||grad L_t(w_t)|| ||Delta_t|| +
  beta_t / 2 ||Delta_t||^2, with beta_t the largest lambda_max on a grid of the segment w_t + gamma Delta_t
  (the Lagrange form of Taylor's theorem makes the M_t remainder term unnecessary when beta_t is the supremum;
  a grid estimates it from below, so the printed bound is an estimate, not a certificate).
- joint_task_linearity: delta_{s,t}(alpha) of Theorem C.8 and its bound 1/2 alpha (1 - alpha)
  (lambda_s + lambda_t) ||w_s - w_t||^2.
- loss_landscape: every task's loss and their mean on the plane w_merge + a d1 + b d2 (App. B.4, Figs. 4, 5),
  spanned by filter_normalized_direction (Li et al., 2018) or by task_vector_plane.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dpmerge import losses
from dpmerge.backbones import Backbone, TaskModel
from dpmerge.evaluate import evaluate_head

TaskVector = dict[str, torch.Tensor]


def _global_norm(tensors: TaskVector) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors.values())))


def reference_drift(pretrained: TaskVector, task_vectors: list[TaskVector]) -> tuple[float, list[float]]:
    """Return (mean drift, per-task ||tau_t|| / ||w0||)."""
    base = _global_norm(pretrained)
    if base == 0:
        raise ValueError("pretrained weights have zero norm; drift is undefined")
    per_task = [_global_norm(tv) / base for tv in task_vectors]
    return float(np.mean(per_task)), per_task


def barrier_height(gammas: np.ndarray, losses: np.ndarray) -> float:
    """Largest excess of the loss path over the straight line between its endpoints."""
    line = (1 - gammas) * losses[0] + gammas * losses[-1]
    return float(np.max(losses - line))


@torch.no_grad()
def interpolation_curve(
    backbone: Backbone,
    pretrained: TaskVector,
    task_vector: TaskVector,
    merged_vector: TaskVector,
    head: dict[str, torch.Tensor],
    features: tuple[torch.Tensor, ...],
    labels: torch.Tensor,
    metric: str,
    gammas: np.ndarray,
) -> list[dict]:
    """Loss and score along w(gamma) = (1 - gamma) w_t + gamma w_merge, with task t's head throughout."""
    rows = []
    for gamma in gammas:
        state = {
            name: pretrained[name] + (1 - gamma) * task_vector[name] + gamma * merged_vector[name]
            for name in pretrained
        }
        backbone.load_top_state(state)
        result = evaluate_head(backbone, head, features, labels, metric)
        rows.append({"gamma": float(gamma), "loss": result["loss"], "score": result["score"]})
    backbone.load_top_state(pretrained)
    return rows


Parameters = dict[str, torch.Tensor]
Loss = Callable[[Parameters], torch.Tensor]


def _detached(params: Parameters) -> Parameters:
    return {name: value.detach().clone().requires_grad_(True) for name, value in params.items()}


def _dot(first: Parameters, second: Parameters) -> torch.Tensor:
    return sum((first[name].double() * second[name].double()).sum() for name in first)


def _axpy(params: Parameters, scale: float, direction: Parameters) -> Parameters:
    return {name: params[name].detach() + scale * direction[name] for name in params}


def loss_gradient(loss: Loss, params: Parameters) -> tuple[float, Parameters]:
    """(L(w), grad L(w)) for a loss given as a function of the parameter mapping."""
    leaves = _detached(params)
    value = loss(leaves)
    grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    return float(value.detach()), {name: torch.zeros_like(leaves[name]) if g is None else g.detach()
                          for name, g in zip(leaves, grads)}


def sharpness_proxy(loss: Loss, params: Parameters, rho: float) -> float:
    """Sharp(w; rho) = L(w + rho grad L(w) / ||grad L(w)||_2) - L(w): the loss increase one normalised
    gradient-ascent step of length rho causes. 0 at a stationary point (no ascent direction)."""
    if not rho > 0:
        raise ValueError(f"sharpness rho must be > 0, got {rho}")
    value, grad = loss_gradient(loss, params)
    norm = float(torch.sqrt(_dot(grad, grad)))
    if norm == 0:
        return 0.0
    with torch.no_grad():
        return float(loss(_axpy(params, rho / norm, grad))) - value


def hessian_vector_product(loss: Loss, params: Parameters, vector: Parameters) -> Parameters:
    leaves = _detached(params)
    grads = torch.autograd.grad(loss(leaves), list(leaves.values()), create_graph=True, allow_unused=True)
    pairs = [(g, leaves[name], vector[name]) for name, g in zip(leaves, grads) if g is not None]
    products = torch.autograd.grad([g for g, _, _ in pairs], [leaf for _, leaf, _ in pairs],
                                   grad_outputs=[v for _, _, v in pairs], allow_unused=True)
    by_leaf = {id(leaf): p for (_, leaf, _), p in zip(pairs, products)}
    return {name: (by_leaf.get(id(leaf)) if by_leaf.get(id(leaf)) is not None else torch.zeros_like(leaf)).detach()
            for name, leaf in leaves.items()}


def _power_iteration(apply, like: Parameters, iterations: int, tolerance: float, seed: int) -> float:
    generator = torch.Generator().manual_seed(seed)
    vector = {name: torch.randn(value.shape, generator=generator, dtype=value.dtype) for name, value in like.items()}
    estimate = 0.0
    for _ in range(iterations):
        norm = float(torch.sqrt(_dot(vector, vector)))
        if norm == 0:
            return 0.0
        vector = {name: value / norm for name, value in vector.items()}
        product = apply(vector)
        new_estimate = float(_dot(vector, product))  # Rayleigh quotient of the unit vector
        vector = product
        if abs(new_estimate - estimate) <= tolerance * max(abs(new_estimate), 1e-30):
            return new_estimate
        estimate = new_estimate
    return estimate


def hessian_max_eigenvalue(loss: Loss, params: Parameters, iterations: int = 100, tolerance: float = 1e-4,
                           seed: int = 0) -> float:
    """lambda_max of the Hessian of `loss` at `params` by power iteration on Hessian-vector products (seeded
    start, stops when the Rayleigh quotient changes by less than `tolerance` relatively).

    Power iteration finds the eigenvalue of largest magnitude; when that one is negative (a saddle, possible
    for a noisy DP solution) it is run again on H - mu I, whose dominant eigenvalue is lambda_max - mu."""
    dominant = _power_iteration(lambda v: hessian_vector_product(loss, params, v), params, iterations,
                                tolerance, seed)
    if dominant >= 0:
        return dominant

    def shifted(vector):
        product = hessian_vector_product(loss, params, vector)
        return {name: product[name] - dominant * vector[name] for name in vector}

    return _power_iteration(shifted, params, iterations, tolerance, seed + 1) + dominant


def merge_gap_bound(loss: Loss, task_params: Parameters, merged_params: Parameters, gammas=(0.0, 0.5, 1.0),
                    iterations: int = 100, tolerance: float = 1e-4, seed: int = 0) -> dict:
    """The merge gap Gap_t = L_t(w_merge) - L_t(w_t) beside the right-hand side of Theorem 5.2 evaluated from
    measured quantities: ||grad L_t(w_t)|| ||Delta_t|| + beta_t / 2 ||Delta_t||^2, Delta_t = w_merge - w_t,
    beta_t = max over `gammas` of lambda_max(H_t(w_t + gamma Delta_t))."""
    task_loss, grad = loss_gradient(loss, task_params)
    with torch.no_grad():
        merged_loss = float(loss({name: value.detach() for name, value in merged_params.items()}))
    delta = {name: merged_params[name].detach() - task_params[name].detach() for name in task_params}
    displacement = float(torch.sqrt(_dot(delta, delta)))
    gradient_norm = float(torch.sqrt(_dot(grad, grad)))
    curvatures = [hessian_max_eigenvalue(loss, _axpy(task_params, float(gamma), delta), iterations, tolerance, seed)
                  for gamma in gammas]
    beta = max(curvatures)
    return {
        "task_loss": task_loss,
        "merged_loss": merged_loss,
        "merge_gap": merged_loss - task_loss,
        "gradient_norm": gradient_norm,
        "displacement": displacement,
        "lambda_max_at_task": curvatures[0] if float(gammas[0]) == 0.0 else None,
        "beta": beta,
        "bound": gradient_norm * displacement + 0.5 * beta * displacement**2,
    }


def joint_task_linearity(loss_s: Loss, loss_t: Loss, params_s: Parameters, params_t: Parameters, alphas,
                         lambda_s: float, lambda_t: float) -> list[dict]:
    """delta_{s,t}(alpha) = L_JTL(alpha w_s + (1 - alpha) w_t) - alpha L_JTL(w_s) - (1 - alpha) L_JTL(w_t),
    L_JTL = L_s + L_t (Theorem C.8), beside its second-order bound 1/2 alpha (1 - alpha) (lambda_s + lambda_t)
    ||w_s - w_t||^2 (lambda_s, lambda_t: hessian_max_eigenvalue of each task's loss at its own model)."""
    def joint(params):
        with torch.no_grad():
            return float(loss_s(params)) + float(loss_t(params))

    s = {name: value.detach() for name, value in params_s.items()}
    t = {name: value.detach() for name, value in params_t.items()}
    difference = {name: s[name] - t[name] for name in s}
    distance_squared = float(_dot(difference, difference))
    at_s, at_t = joint(s), joint(t)
    rows = []
    for alpha in alphas:
        alpha = float(alpha)
        between = {name: alpha * s[name] + (1 - alpha) * t[name] for name in s}
        rows.append({
            "alpha": alpha,
            "delta": joint(between) - alpha * at_s - (1 - alpha) * at_t,
            "bound": 0.5 * alpha * (1 - alpha) * (lambda_s + lambda_t) * distance_squared,
        })
    return rows


def task_loss(backbone: Backbone, head: dict[str, torch.Tensor], features: tuple[torch.Tensor, ...],
              labels: torch.Tensor) -> Loss:
    """L_t as a function of the backbone's top parameters (names as in top_state): mean cross-entropy of the
    top + task t's head on the given examples, differentiable twice (functional_call swaps the top's
    parameters in, so Hessian-vector products need no copies of the model)."""
    model = TaskModel.with_head(backbone, head)
    model.head.requires_grad_(False)
    model.eval()
    prefix = "backbone_network."
    # The network runs on the backbone's device; the parameters and the returned loss stay on the CPU, where the
    # diagnostics keep their directions and iterates (autograd carries gradients and HVPs across the copy).
    device = backbone.device
    features = tuple(f.to(device) for f in features)
    labels = labels.to(device)

    def loss(params: Parameters) -> torch.Tensor:
        # Released names -> the network's (differentiable: the CLIP ViT's q/k/v are slices of in_proj)
        internal = backbone.internal_state({name: value.to(device) for name, value in params.items()})
        # The math attention kernel: the fused CPU kernels have no double backward (Hessian-vector products)
        with sdpa_kernel([SDPBackend.MATH]):
            logits = torch.func.functional_call(model, {prefix + name: value for name, value in internal.items()},
                                                features, strict=False)
        return losses.task_loss(logits, labels).cpu()

    return loss


def filter_normalized_direction(params: Parameters, seed: int) -> Parameters:
    """A seeded Gaussian direction in parameter space, filter-normalised as in Li et al. 2018 ("Visualizing the
    loss landscape of neural nets", Sec. 4): every filter of the draw (a slice along dim 0 of a tensor with two
    or more dimensions: a conv filter, one output row of a linear layer) is rescaled to the norm of the same
    filter of `params`.

    Without the rescaling a step of given length is a large relative change for small-norm filters and a small
    one for large-norm filters, so two models whose weights differ in scale (a noisier DP model, a merge that
    shrinks or sums task vectors) would look flatter or sharper for that reason alone; filter normalisation
    makes landscapes of different models comparable.

    Tensors with at most one dimension (biases, layer-norm scales and shifts) get a zero direction, Li et al.'s
    "ignore biasbn" setting: they have no filters to normalise by (each entry would be its own one-number
    filter, moved by its own magnitude), and the norm layers' scales act on normalised activations, so their
    perturbation means something else than a filter's; the plane moves the weight matrices and filters only.

    The draw runs over tensors in name order from torch.Generator().manual_seed(seed): the same parameters and
    seed give the same direction on every machine and process.
    """
    generator = torch.Generator().manual_seed(seed)
    direction = {}
    for name in sorted(params):
        value = params[name].detach()
        if value.ndim <= 1:
            direction[name] = torch.zeros_like(value)
            continue
        draw = torch.randn(value.shape, generator=generator, dtype=torch.float64)
        draw_norms = draw.flatten(1).norm(dim=1)
        filter_norms = value.double().flatten(1).norm(dim=1)
        scale = filter_norms / draw_norms.clamp_min(torch.finfo(torch.float64).tiny)
        direction[name] = (draw * scale.view(-1, *([1] * (value.ndim - 1)))).to(value.dtype)
    return {name: direction[name] for name in params}


def task_vector_plane(task_a: TaskVector, task_b: TaskVector) -> tuple[TaskVector, TaskVector]:
    """The plane of two task vectors as landscape directions (d1, d2) = (tau_a, tau_b), unscaled: the point
    (a, b) of a landscape centred at w is w + a tau_a + b tau_b, so coordinates are multiples of the task
    vectors, the unit that merging coefficients such as task arithmetic's lambda are given in.

    Centred at task arithmetic of two tasks, w0 + lambda (tau_a + tau_b), the point (-lambda, -lambda) is w0
    and (1 - lambda, -lambda) is task a's own model w0 + tau_a; with more tasks the plane through the merge
    misses w0 and the task models."""
    if set(task_a) != set(task_b):
        raise ValueError(f"task vectors differ in tensors: {sorted(set(task_a) ^ set(task_b))[:3]}")
    for name in task_a:
        if task_a[name].shape != task_b[name].shape:
            raise ValueError(f"task vectors differ in the shape of {name!r}: {tuple(task_a[name].shape)} vs "
                             f"{tuple(task_b[name].shape)}")
    return task_a, task_b


@torch.no_grad()
def loss_landscape(losses: dict[str, Loss], centre: Parameters, d1: Parameters, d2: Parameters, coordinates_a,
                   coordinates_b, log: Callable[[str], None] | None = None) -> list[dict]:
    """Every loss at w(a, b) = centre + a d1 + b d2 on the grid coordinates_a x coordinates_b, the 2-D loss
    landscape of the paper's App. B.4 (Figs. 4, 5) after Li et al. 2018, Sec. 3; each point's mean over the
    tasks is the merged model's multi-task loss, the quantity the figures contour.

    Returns rows {"a", "b", "task", "loss"}, for a in coordinates_a, for b in coordinates_b: one row per task in
    the order of `losses`, then one row of task "mean". `log`, if given, gets one line per value of a, so a long
    grid shows its progress.
    """
    if not losses:
        raise ValueError("loss_landscape needs at least one loss")
    if "mean" in losses:
        raise ValueError("a task named 'mean' would be confused with the rows of the mean over tasks")
    for label, direction in (("d1", d1), ("d2", d2)):
        if set(direction) != set(centre):
            raise ValueError(f"direction {label} has other tensors than the centre: "
                             f"{sorted(set(direction) ^ set(centre))[:3]}")
    centre = {name: value.detach() for name, value in centre.items()}
    rows = []
    for index, a in enumerate(coordinates_a):
        a = float(a)
        means = []
        for b in coordinates_b:
            b = float(b)
            point = {name: (value + a * d1[name] + b * d2[name]).to(value.dtype) for name, value in centre.items()}
            values = {task: float(loss(point)) for task, loss in losses.items()}
            means.append(float(np.mean(list(values.values()))))
            rows.extend({"a": a, "b": b, "task": task, "loss": value} for task, value in values.items())
            rows.append({"a": a, "b": b, "task": "mean", "loss": means[-1]})
        if log is not None:
            log(f"a = {a:+.4g} ({index + 1}/{len(coordinates_a)}): mean loss {min(means):.4g} to {max(means):.4g}")
    return rows
