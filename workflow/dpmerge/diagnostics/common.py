"""What the diagnostics of "When Privacy Hurts Mergeability" (arXiv 2608.26655, Sec. 3.2) share: parameter
mappings (name -> tensor) and their algebra, and the task loss they differentiate.

- task_loss: L_t as a function of the backbone's top parameters, the mean cross-entropy of the top and task t's
  head on given examples, differentiable twice (what the curvature, linearity and landscape diagnostics take).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dpmerge.models import losses
from dpmerge.models.base import Backbone, TaskModel

TaskVector = dict[str, torch.Tensor]
Parameters = dict[str, torch.Tensor]
Loss = Callable[[Parameters], torch.Tensor]


def detached(params: Parameters) -> Parameters:
    return {name: value.detach().clone().requires_grad_(True) for name, value in params.items()}


def dot(first: Parameters, second: Parameters) -> torch.Tensor:
    return sum((first[name].double() * second[name].double()).sum() for name in first)


def axpy(params: Parameters, scale: float, direction: Parameters) -> Parameters:
    return {name: params[name].detach() + scale * direction[name] for name in params}


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
