"""Sums of per-example clipped gradients, sum_i clip_C(grad l(w; z_i)), by three interchangeable strategies.

Every strategy returns the same tensors (up to float rounding; tests/test_persample.py checks each against a
per-example loop); they differ only in cost, so the choice is per backbone (`Backbone.per_sample_strategy`,
overridable with `finetune.per_sample_gradients`):

- "functorch": Opacus's GradSampleModule in vmap mode. Materialises every per-example gradient (B x params
  memory).
- "hooks": Opacus's GradSampleModule with its per-layer hooks (the Opacus default). Materialises per-example
  gradients too; kept as the reference implementation everyone knows.
- "bookkeeping": one forward and ONE backward pass that computes only activation gradients (no weight
  gradients), then per layer the per-example gradient norms, by the ghost-norm identity
  ||sum_t g_t a_t^T||^2 = sum_{t,s} (a_t.a_s)(g_t.g_s) when that is cheaper than instantiating, and the clipped
  sum sum_i c_i G_i^T A_i as one matrix product. This is book-keeping (Bu et al., "Differentially private
  optimization on large model at small cost", 2023). Opacus's ghost clipping needs a second backward pass
  instead (measured ~1.8-2x a non-private step on transformers; bench/dp_step.py). Chosen for transformers.
  Grouped (depthwise) convolutions instantiate their small per-example gradients; layers without a rule (e.g.
  a ViT's class token) fall back to per-example gradients by vmap for that layer only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

STRATEGIES = ("functorch", "hooks", "bookkeeping")


def clip_factors(squared_norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """c_i = 1 / max(1, ||g_i|| / C): the factor that clips example i's whole gradient to norm at most C."""
    return 1.0 / torch.clamp(squared_norms.clamp(min=0).sqrt() / clip_norm, min=1.0)


class OpacusClipper:
    """Per-example gradients materialised by Opacus's GradSampleModule (vmap or hooks), then clipped and summed."""

    def __init__(self, model: nn.Module, strategy: str):
        from opacus import GradSampleModule

        # loss_reduction="sum" matters: with Opacus's default "mean" every per-sample gradient is scaled by B.
        self.strategy = strategy
        self.module = GradSampleModule(model, loss_reduction="sum", force_functorch=strategy == "functorch")
        # Hooks stay off outside queries: otherwise every other forward/backward through the model (progress
        # losses, evaluation) pays for per-example gradients too.
        self.module.disable_hooks()
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    def clipped_sum(self, features, labels, clip_norm: float) -> list[torch.Tensor]:
        if labels.numel() == 0:
            return [torch.zeros_like(p) for p in self.params]
        self.module.zero_grad(set_to_none=True)
        self.module.enable_hooks()
        try:
            F.cross_entropy(self.module(*features), labels, reduction="sum").backward()
        finally:
            self.module.disable_hooks()
        grads = [p.grad_sample for p in self.params]
        squared = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads)
        factors = clip_factors(squared, clip_norm)
        summed = [torch.einsum("i,i...->...", factors, g) for g in grads]
        self.module.zero_grad(set_to_none=True)
        return summed

    def close(self) -> None:
        self.module._close()  # remove hooks: the backbone is shared with later models in this process


# ------------------------------------------------------------------------------------------- book-keeping


@dataclass
class _Call:
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor
    versions: tuple[int, ...]


class LayerRule:
    """Per-example squared gradient norms and the clipped sum for one layer type, from its input and output grad."""

    def squared_norms(self, module, inputs, grad_output) -> dict[str, torch.Tensor]:  # name -> (B,)
        raise NotImplementedError

    def clipped_sums(self, module, inputs, grad_output, factors) -> dict[str, torch.Tensor]:
        raise NotImplementedError


def _linear_weight_squared_norms(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """||G_i^T A_i||_F^2 for a (B, T, d_in), g (B, T, d_out): ghost norm or instantiation, whichever is cheaper."""
    tokens, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
    if tokens == 1:
        return a.pow(2).sum((1, 2)) * g.pow(2).sum((1, 2))
    if tokens * (d_in + d_out) < d_in * d_out:
        return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
    return torch.bmm(g.transpose(1, 2), a).pow(2).sum((1, 2))


class LinearRule(LayerRule):
    @staticmethod
    def _flat(module, inputs, grad_output):
        batch = grad_output.shape[0]
        return inputs[0].reshape(batch, -1, module.in_features), grad_output.reshape(batch, -1, module.out_features)

    def squared_norms(self, module, inputs, grad_output):
        a, g = self._flat(module, inputs, grad_output)
        norms = {"weight": _linear_weight_squared_norms(a, g)}
        if module.bias is not None:
            norms["bias"] = g.sum(1).pow(2).sum(1)
        return norms

    def clipped_sums(self, module, inputs, grad_output, factors):
        a, g = self._flat(module, inputs, grad_output)
        weighted = g * factors[:, None, None]
        sums = {"weight": weighted.reshape(-1, g.shape[2]).T @ a.reshape(-1, a.shape[2])}
        if module.bias is not None:
            sums["bias"] = weighted.sum((0, 1))
        return sums


class Conv2dRule(LinearRule):
    """A convolution is a linear layer over unfolded patches, one per group (depthwise: one per channel)."""

    @staticmethod
    def supports(module) -> bool:
        return module.padding_mode == "zeros" and not isinstance(module.padding, str)

    @staticmethod
    def _flat(module, inputs, grad_output):
        batch = grad_output.shape[0]
        patches = F.unfold(inputs[0], module.kernel_size, module.dilation, module.padding, module.stride)
        return patches.transpose(1, 2), grad_output.reshape(batch, module.out_channels, -1).transpose(1, 2)

    def _grouped_per_example(self, module, inputs, grad_output):
        """Per-example weight gradients (B, *weight.shape); cheap when groups > 1 (each group is small)."""
        a, g = self._flat(module, inputs, grad_output)  # (B, L, C_in*k*k), (B, L, C_out)
        batch, tokens, groups = a.shape[0], a.shape[1], module.groups
        a = a.reshape(batch, tokens, groups, -1)
        g = g.reshape(batch, tokens, groups, -1)
        return torch.einsum("blgo,blgi->bgoi", g, a).reshape(batch, *module.weight.shape)

    def squared_norms(self, module, inputs, grad_output):
        if module.groups == 1:
            return super().squared_norms(module, inputs, grad_output)
        norms = {"weight": self._grouped_per_example(module, inputs, grad_output).pow(2).sum((1, 2, 3, 4))}
        if module.bias is not None:
            norms["bias"] = grad_output.sum((2, 3)).pow(2).sum(1)
        return norms

    def clipped_sums(self, module, inputs, grad_output, factors):
        if module.groups == 1:
            sums = super().clipped_sums(module, inputs, grad_output, factors)
            sums["weight"] = sums["weight"].reshape(module.weight.shape)
            return sums
        sums = {"weight": torch.einsum("i,i...->...", factors, self._grouped_per_example(module, inputs, grad_output))}
        if module.bias is not None:
            sums["bias"] = torch.einsum("i,io->o", factors, grad_output.sum((2, 3)))
        return sums


class LayerNormRule(LayerRule):
    @staticmethod
    def _per_example(module, inputs, grad_output):
        normalized = F.layer_norm(inputs[0], module.normalized_shape, None, None, module.eps)
        dims = tuple(range(1, grad_output.dim() - len(module.normalized_shape)))
        grads = {"weight": (grad_output * normalized).sum(dims) if dims else grad_output * normalized}
        if module.bias is not None:
            grads["bias"] = grad_output.sum(dims) if dims else grad_output
        return grads

    def squared_norms(self, module, inputs, grad_output):
        return {name: g.reshape(g.shape[0], -1).pow(2).sum(1) for name, g in self._per_example(module, inputs, grad_output).items()}

    def clipped_sums(self, module, inputs, grad_output, factors):
        return {name: torch.einsum("i,i...->...", factors, g) for name, g in self._per_example(module, inputs, grad_output).items()}


class EmbeddingRule(LayerRule):
    @staticmethod
    def supports(module) -> bool:
        return module.max_norm is None and not module.scale_grad_by_freq and not module.sparse

    @staticmethod
    def _flat(module, inputs, grad_output):
        batch = grad_output.shape[0]
        ids = inputs[0].reshape(batch, -1)
        g = grad_output.reshape(batch, -1, module.embedding_dim)
        if module.padding_idx is not None:  # nn.Embedding never updates its padding row
            g = g * (ids != module.padding_idx).unsqueeze(-1).to(g.dtype)
        return ids, g

    def squared_norms(self, module, inputs, grad_output):
        ids, g = self._flat(module, inputs, grad_output)
        same_row = (ids[:, :, None] == ids[:, None, :]).to(g.dtype)
        return {"weight": (same_row * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))}

    def clipped_sums(self, module, inputs, grad_output, factors):
        ids, g = self._flat(module, inputs, grad_output)
        weighted = (g * factors[:, None, None]).reshape(-1, g.shape[2])
        return {"weight": torch.zeros_like(module.weight).index_add_(0, ids.reshape(-1), weighted)}


class VmapRule(LayerRule):
    """Any layer: per-example gradients of its own parameters by vmap over (input, output grad) pairs."""

    @staticmethod
    def _per_example(module, inputs, grad_output):
        own = {name: p.detach() for name, p in module.named_parameters(recurse=False) if p.requires_grad}

        def contribution(params, grad_out, *args):
            out = torch.func.functional_call(module, params, tuple(a.unsqueeze(0) for a in args))
            return (out * grad_out.unsqueeze(0)).sum()

        return torch.func.vmap(torch.func.grad(contribution), in_dims=(None, 0) + (0,) * len(inputs))(
            own, grad_output, *inputs
        )

    def squared_norms(self, module, inputs, grad_output):
        return {name: g.reshape(g.shape[0], -1).pow(2).sum(1) for name, g in self._per_example(module, inputs, grad_output).items()}

    def clipped_sums(self, module, inputs, grad_output, factors):
        return {name: torch.einsum("i,i...->...", factors, g) for name, g in self._per_example(module, inputs, grad_output).items()}


def rule_for(module: nn.Module) -> LayerRule:
    if type(module) is nn.Linear:
        return LinearRule()
    if type(module) is nn.Conv2d and Conv2dRule.supports(module):
        return Conv2dRule()
    if type(module) is nn.LayerNorm:
        return LayerNormRule()
    if type(module) is nn.Embedding and EmbeddingRule.supports(module):
        return EmbeddingRule()
    return VmapRule()


class BookKeepingClipper:
    """Clipped per-example gradient sums from one forward and one activation-only backward pass (see module doc).

    Hooks record each trainable layer's inputs and output during the forward; `torch.autograd.grad` with
    respect to those outputs then yields every layer's output gradient without computing any weight gradient.
    Requirements, checked at run time: every layer with trainable parameters is called once per forward with
    tensor inputs and one tensor output, and neither is modified in place afterwards.
    """

    strategy = "bookkeeping"

    def __init__(self, model: nn.Module):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers: list[tuple[str, nn.Module, LayerRule]] = []
        for name, module in model.named_modules():
            if any(p.requires_grad for p in module.parameters(recurse=False)):
                self.layers.append((name, module, rule_for(module)))
        self._calls: dict[int, list[_Call]] = {}
        self._recording = False
        self._handles = [module.register_forward_hook(self._record, with_kwargs=True) for _, module, _ in self.layers]

    def _record(self, module, inputs, kwargs, output):
        if not self._recording:
            return
        if kwargs or not isinstance(output, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise TypeError(
                f"book-keeping needs positional tensor inputs and one tensor output from {type(module).__name__}; "
                "use per_sample_gradients 'functorch' for this model"
            )
        calls = self._calls.setdefault(id(module), [])
        if calls:
            raise RuntimeError(
                f"{type(module).__name__} was called twice in one forward (shared weights); "
                "use per_sample_gradients 'functorch' for this model"
            )
        inputs = tuple(t.detach() for t in inputs)
        calls.append(_Call(inputs, output, tuple(t._version for t in (*inputs, output))))

    def clipped_sum(self, features, labels, clip_norm: float) -> list[torch.Tensor]:
        if labels.numel() == 0:
            return [torch.zeros_like(p) for p in self.params]
        self._calls = {}
        self._recording = True
        try:
            loss = F.cross_entropy(self.model(*features), labels, reduction="sum")
        finally:
            self._recording = False
        layers = [(name, module, rule, self._calls[id(module)][0]) for name, module, rule in self.layers
                  if id(module) in self._calls]
        for name, module, _, call in layers:
            if tuple(t._version for t in (*call.inputs, call.output)) != call.versions:
                raise RuntimeError(f"layer {name!r} ({type(module).__name__}): its input or output was modified "
                                   "in place after the forward; per-example gradients would be wrong")
        # Only activation gradients are requested, so autograd never computes a (non-private) weight gradient.
        grad_outputs = torch.autograd.grad(loss, [call.output for *_, call in layers], allow_unused=True)
        batch = labels.shape[0]
        squared = torch.zeros(batch, dtype=loss.dtype)
        for (name, module, rule, call), grad_output in zip(layers, grad_outputs):
            if grad_output is not None:
                for value in rule.squared_norms(module, call.inputs, grad_output).values():
                    squared = squared + value
        factors = clip_factors(squared, clip_norm)
        sums: dict[int, torch.Tensor] = {}
        for (name, module, rule, call), grad_output in zip(layers, grad_outputs):
            if grad_output is None:
                continue
            own = dict(module.named_parameters(recurse=False))
            for param_name, value in rule.clipped_sums(module, call.inputs, grad_output, factors).items():
                sums[id(own[param_name])] = value
        self._calls = {}
        return [sums[id(p)] if id(p) in sums else torch.zeros_like(p) for p in self.params]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def make_clipper(model: nn.Module, strategy: str):
    """The per-example clipped-gradient oracle for `model` by `strategy` (one of STRATEGIES)."""
    if strategy in ("functorch", "hooks"):
        return OpacusClipper(model, strategy)
    if strategy == "bookkeeping":
        return BookKeepingClipper(model)
    raise ValueError(f"unknown per_sample_gradients strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
