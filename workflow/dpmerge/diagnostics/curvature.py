"""Curvature of a task's loss and the merge gap it bounds, Sec. 3.2, Eq. 3 and Theorem 5.2 / C.4 of "When Privacy
Hurts Mergeability" (arXiv 2608.26655), on any differentiable loss given as a function of a parameter mapping
(name -> tensor):

- sharpness_proxy: Sharp_t(w_t; rho) = L_t(w_t + rho grad/||grad||) - L_t(w_t) (Sec. 3.2, Fig. 3a).
- hessian_max_eigenvalue: lambda_max(H_t) by power iteration on Hessian-vector products (Eq. 3).
- merge_gap_bound: Theorem 5.2 / C.4 from measured quantities, ||grad L_t(w_t)|| ||Delta_t|| +
  beta_t / 2 ||Delta_t||^2, with beta_t the largest lambda_max on a grid of the segment w_t + gamma Delta_t
  (the Lagrange form of Taylor's theorem makes the M_t remainder term unnecessary when beta_t is the supremum;
  a grid estimates it from below, so the printed bound is an estimate, not a certificate).
"""

from __future__ import annotations

import torch

from dpmerge.diagnostics.common import Loss, Parameters, axpy, detached, dot


def loss_gradient(loss: Loss, params: Parameters) -> tuple[float, Parameters]:
    """(L(w), grad L(w)) for a loss given as a function of the parameter mapping."""
    leaves = detached(params)
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
    norm = float(torch.sqrt(dot(grad, grad)))
    if norm == 0:
        return 0.0
    with torch.no_grad():
        return float(loss(axpy(params, rho / norm, grad))) - value


def hessian_vector_product(loss: Loss, params: Parameters, vector: Parameters) -> Parameters:
    leaves = detached(params)
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
        norm = float(torch.sqrt(dot(vector, vector)))
        if norm == 0:
            return 0.0
        vector = {name: value / norm for name, value in vector.items()}
        product = apply(vector)
        new_estimate = float(dot(vector, product))  # Rayleigh quotient of the unit vector
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
    displacement = float(torch.sqrt(dot(delta, delta)))
    gradient_norm = float(torch.sqrt(dot(grad, grad)))
    curvatures = [hessian_max_eigenvalue(loss, axpy(task_params, float(gamma), delta), iterations, tolerance, seed)
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
