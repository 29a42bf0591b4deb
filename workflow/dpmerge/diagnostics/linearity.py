"""Joint task linearity, Theorem C.8 of "When Privacy Hurts Mergeability" (arXiv 2608.26655).

- joint_task_linearity: delta_{s,t}(alpha) = L_JTL(alpha w_s + (1 - alpha) w_t) - alpha L_JTL(w_s)
  - (1 - alpha) L_JTL(w_t), L_JTL = L_s + L_t, beside its bound 1/2 alpha (1 - alpha) (lambda_s + lambda_t)
  ||w_s - w_t||^2.
"""

from __future__ import annotations

import torch

from dpmerge.diagnostics.common import Loss, Parameters, dot


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
    distance_squared = float(dot(difference, difference))
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
