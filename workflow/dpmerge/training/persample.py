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
  instead (measured ~1.8x a non-private step on transformers; bench/dp_step.py). The default for every
  backbone: it was the fastest on each one measured.
  Grouped (depthwise) convolutions instantiate their small per-example gradients; layers without a rule (e.g.
  a ViT's class token) fall back to per-example gradients by vmap for that layer only.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dpmerge.models.losses import at_least_float32, task_loss
from dpmerge.privacy.gaussian_mechanism import clip_factors

STRATEGIES = ("functorch", "hooks", "bookkeeping")


def _sums_into(params, into: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """Where a clipper adds its sums (scale * sum_i clip_C(g_i), `scale` e.g. 1 / B): the caller's tensors (one
    per parameter, e.g. already holding the noise), or zeros."""
    if into is None:
        return [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in params]
    if len(into) != len(params) or any(t.shape != p.shape for t, p in zip(into, params)):
        raise ValueError("clipped sums go into one tensor per trainable parameter, in the parameters' order and shapes")
    return into


class OpacusClipper:
    """Per-example gradients materialised by Opacus's GradSampleModule (vmap or hooks), then clipped and summed."""

    def __init__(self, model: nn.Module, strategy: str, autocast=contextlib.nullcontext):
        from opacus import GradSampleModule

        self.autocast = autocast
        # loss_reduction="sum" matters: with Opacus's default "mean" every per-sample gradient is scaled by B.
        self.strategy = strategy
        self.module = GradSampleModule(model, loss_reduction="sum", force_functorch=strategy == "functorch")
        # Hooks stay off outside queries: otherwise every other forward/backward through the model (progress
        # losses, evaluation) pays for per-example gradients too.
        self.module.disable_hooks()
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    def clipped_sum(self, features, labels, clip_norm: float, into=None, scale: float = 1.0) -> list[torch.Tensor]:
        into = _sums_into(self.params, into)
        if labels.numel() == 0:
            return into
        self.module.zero_grad(set_to_none=True)
        self.module.enable_hooks()
        try:
            with self.autocast():
                loss = task_loss(self.module(*features), labels, reduction="sum")
            loss.backward()
        finally:
            self.module.disable_hooks()
        # Norms, clipping and sums in float32 whatever precision the forward ran in.
        grads = PerExampleGradients({str(i): at_least_float32(p.grad_sample) for i, p in enumerate(self.params)})
        factors = clip_factors(grads.squared_norms(), clip_norm) * scale
        grads.add_clipped_sums(factors, {str(i): t for i, t in enumerate(into)})
        self.module.zero_grad(set_to_none=True)
        return into

    def close(self) -> None:
        self.module._close()  # remove hooks: the backbone is shared with later models in this process


# ------------------------------------------------------------------------------------------- book-keeping


@dataclass
class _Call:
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor
    versions: tuple[int, ...]


def _identity(tensor: torch.Tensor) -> tuple:
    """Equal for two tensors only if they are the same view of the same memory (so, while both live, equal)."""
    return tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device


class PerInput:
    """f(x) computed once per query for each activation tensor x, however many layers read x: a transformer's
    query, key and value projections all read the same hidden states, so their ghost norms need one Gram of
    them and their clipped sums one copy scaled by the clip factors, not three. `readers` lists x once per layer
    that will ask; a value is dropped as soon as its last reader has it."""

    def __init__(self, function, readers):
        self._function = function
        self._left = Counter(map(_identity, readers))
        self._values: dict[tuple, torch.Tensor] = {}

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _identity(tensor)
        value = self._values.pop(key, None)
        if value is None:
            value = self._function(tensor)
        self._left[key] -= 1
        if self._left[key] > 0:
            self._values[key] = value
        return value


def _gram(x: torch.Tensor) -> torch.Tensor:
    """x x^T per example: (B, T, d) -> (B, T, T)."""
    return torch.bmm(x, x.transpose(1, 2))


class LayerGradients:
    """One layer call's per-example gradient information, from its inputs and output gradient.

    Built once per query and asked twice: for the per-example squared norms (summed over the layer's
    parameters), then, once the clip factors are known, to add the clipped sums onto the tensors named by its
    parameters' names (only those present: a frozen parameter has none). A layer that
    needs the Gram of an activation, or an activation scaled by the factors, names it (gram_inputs,
    scaled_inputs) and receives it through a PerInput shared with the other layers.
    """

    def gram_inputs(self) -> tuple[torch.Tensor, ...]:
        return ()

    def scaled_inputs(self) -> tuple[torch.Tensor, ...]:
        return ()

    def squared_norms(self, grams: PerInput | None = None) -> torch.Tensor:  # (B,)
        raise NotImplementedError

    def add_clipped_sums(self, factors: torch.Tensor, out: dict[str, torch.Tensor],
                         scaled: PerInput | None = None) -> None:
        raise NotImplementedError


class PerExampleGradients(LayerGradients):
    """Instantiated per-example gradients, name -> (B, *param.shape): cheap for small layers."""

    def __init__(self, grads: dict[str, torch.Tensor]):
        self.grads = grads

    def squared_norms(self, grams=None):
        return sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in self.grads.values())

    def add_clipped_sums(self, factors, out, scaled=None):
        for name, g in self.grads.items():
            if name in out:
                out[name].view(-1).addmv_(g.reshape(g.shape[0], -1).T, factors)


def _ghost_norm_is_cheaper(a: torch.Tensor, g: torch.Tensor) -> bool:
    """Two (T x T) Grams cost T^2 (d_in + d_out) per example, one instantiated gradient T d_in d_out."""
    tokens, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
    return tokens > 1 and tokens * (d_in + d_out) < d_in * d_out


def _linear_weight_squared_norms(a: torch.Tensor, g: torch.Tensor, grams: PerInput | None = None) -> torch.Tensor:
    """||G_i^T A_i||_F^2 for a (B, T, d_in), g (B, T, d_out): ghost norm or instantiation, whichever is cheaper.
    `grams` supplies A A^T when other layers read the same a."""
    if a.shape[1] == 1:
        return a.pow(2).sum((1, 2)) * g.pow(2).sum((1, 2))
    if _ghost_norm_is_cheaper(a, g):
        return ((grams or _gram)(a) * _gram(g)).sum((1, 2))
    return torch.bmm(g.transpose(1, 2), a).pow(2).sum((1, 2))


class TokenLinearGradients(LayerGradients):
    """A linear map applied to T tokens per example: a (B, T, d_in), g (B, T, d_out); never instantiated."""

    def __init__(self, a, g, weight_shape, has_bias: bool):
        self.a, self.g, self.weight_shape, self.has_bias = a, g, weight_shape, has_bias
        self.bias_grads = g.sum(1) if has_bias else None  # (B, d_out): per-example bias gradients

    def gram_inputs(self):
        return (self.a,) if _ghost_norm_is_cheaper(self.a, self.g) else ()

    def scaled_inputs(self):
        return (self.a,) if self.a.shape[2] <= self.g.shape[2] else ()

    def squared_norms(self, grams=None):
        norms = _linear_weight_squared_norms(self.a, self.g, grams)
        return norms + self.bias_grads.pow(2).sum(1) if self.has_bias else norms

    def add_clipped_sums(self, factors, out, scaled=None):
        # sum_i c_i G_i^T A_i: the factors scale whichever of A and G is smaller (a full copy of it), and the
        # product adds onto out (beta = 1), so a sum is never a tensor of its own
        if "weight" in out:
            a, g = self.a, self.g
            if self.scaled_inputs():
                a = scaled(a) if scaled is not None else a * factors[:, None, None]
            else:
                g = g * factors[:, None, None]
            out["weight"].view(g.shape[2], a.shape[2]).addmm_(g.reshape(-1, g.shape[2]).T, a.reshape(-1, a.shape[2]))
        if self.has_bias and "bias" in out:
            out["bias"].addmv_(self.bias_grads.T, factors)


class EmbeddingGradients(LayerGradients):
    """Token embeddings: ghost norm over positions holding the same token; clipped sum by index_add."""

    def __init__(self, module: nn.Embedding, ids: torch.Tensor, grad_output: torch.Tensor):
        batch = grad_output.shape[0]
        self.weight = module.weight
        self.ids = ids.reshape(batch, -1)
        self.g = grad_output.reshape(batch, -1, module.embedding_dim)
        if module.padding_idx is not None:  # nn.Embedding never updates its padding row
            self.g = self.g * (self.ids != module.padding_idx).unsqueeze(-1).to(self.g.dtype)

    def squared_norms(self, grams=None):
        same_row = (self.ids[:, :, None] == self.ids[:, None, :]).to(self.g.dtype)
        return (same_row * _gram(self.g)).sum((1, 2))

    def add_clipped_sums(self, factors, out, scaled=None):
        if "weight" in out:
            weighted = (self.g * factors[:, None, None]).reshape(-1, self.g.shape[2])
            out["weight"].index_add_(0, self.ids.reshape(-1), weighted)


def _linear(module: nn.Linear, inputs, grad_output) -> LayerGradients:
    batch = grad_output.shape[0]
    return TokenLinearGradients(inputs[0].reshape(batch, -1, module.in_features),
                                grad_output.reshape(batch, -1, module.out_features),
                                module.weight.shape, module.bias is not None)


def _conv2d(module: nn.Conv2d, inputs, grad_output) -> LayerGradients:
    """A convolution is a linear layer over unfolded patches, one per group (depthwise: one per channel)."""
    batch = grad_output.shape[0]
    a = F.unfold(inputs[0], module.kernel_size, module.dilation, module.padding, module.stride).transpose(1, 2)
    g = grad_output.reshape(batch, module.out_channels, -1).transpose(1, 2)  # (B, L, C_out)
    if module.groups == 1:
        return TokenLinearGradients(a, g, module.weight.shape, module.bias is not None)
    # Grouped: instantiate; each group's per-example gradient is small (depthwise: channels x k x k).
    tokens, groups = a.shape[1], module.groups
    weight = torch.einsum("blgo,blgi->bgoi", g.reshape(batch, tokens, groups, -1), a.reshape(batch, tokens, groups, -1))
    grads = {"weight": weight.reshape(batch, *module.weight.shape)}
    if module.bias is not None:
        grads["bias"] = grad_output.sum((2, 3))
    return PerExampleGradients(grads)


def _layer_norm(module: nn.LayerNorm, inputs, grad_output) -> LayerGradients:
    normalized = F.layer_norm(inputs[0], module.normalized_shape, None, None, module.eps)
    dims = tuple(range(1, grad_output.dim() - len(module.normalized_shape)))
    grads = {"weight": (grad_output * normalized).sum(dims) if dims else grad_output * normalized}
    if module.bias is not None:
        grads["bias"] = grad_output.sum(dims) if dims else grad_output
    return PerExampleGradients(grads)


def _embedding(module: nn.Embedding, inputs, grad_output) -> LayerGradients:
    return EmbeddingGradients(module, inputs[0], grad_output)


def _vmap(module: nn.Module, inputs, grad_output) -> LayerGradients:
    """Any layer: per-example gradients of its own parameters by vmap over (input, output grad) pairs."""
    own = {name: p.detach() for name, p in module.named_parameters(recurse=False) if p.requires_grad}

    def contribution(params, grad_out, *args):
        out = torch.func.functional_call(module, params, tuple(a.unsqueeze(0) for a in args))
        return (out * grad_out.unsqueeze(0)).sum()

    grads = torch.func.vmap(torch.func.grad(contribution), in_dims=(None, 0) + (0,) * len(inputs))(
        own, grad_output, *inputs
    )
    return PerExampleGradients(grads)


def rule_for(module: nn.Module):
    """The function (module, inputs, grad_output) -> LayerGradients for this layer."""
    if type(module) is nn.Linear:
        return _linear
    if type(module) is nn.Conv2d and module.padding_mode == "zeros" and not isinstance(module.padding, str):
        return _conv2d
    if type(module) is nn.LayerNorm:
        return _layer_norm
    if (type(module) is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq
            and not module.sparse):
        return _embedding
    return _vmap


class BookKeepingClipper:
    """Clipped per-example gradient sums from one forward and one activation-only backward pass (see module doc).

    Hooks record each trainable layer's inputs and output during the forward; `torch.autograd.grad` with
    respect to those outputs then yields every layer's output gradient without computing any weight gradient.
    Requirements, checked at run time: every layer with trainable parameters is called once per forward with
    tensor inputs and one tensor output, and neither is modified in place afterwards.
    """

    strategy = "bookkeeping"

    def __init__(self, model: nn.Module, autocast=contextlib.nullcontext):
        self.model = model
        self.autocast = autocast
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.layers: list[tuple[str, nn.Module, object]] = []
        for name, module in model.named_modules():
            if any(p.requires_grad for p in module.parameters(recurse=False)):
                self.layers.append((name, module, rule_for(module)))
        self._calls: dict[int, _Call] = {}
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
        if id(module) in self._calls:
            raise RuntimeError(
                f"{type(module).__name__} was called twice in one forward (shared weights); "
                "use per_sample_gradients 'functorch' for this model"
            )
        inputs = tuple(t.detach() for t in inputs)
        self._calls[id(module)] = _Call(inputs, output, tuple(t._version for t in (*inputs, output)))

    def clipped_sum(self, features, labels, clip_norm: float, into=None, scale: float = 1.0) -> list[torch.Tensor]:
        into = _sums_into(self.params, into)
        if labels.numel() == 0:
            return into
        self._calls = {}
        self._recording = True
        try:
            with self.autocast():
                loss = task_loss(self.model(*features), labels, reduction="sum")
        finally:
            self._recording = False
        calls, self._calls = self._calls, {}
        layers = [(name, module, rule, calls[id(module)]) for name, module, rule in self.layers if id(module) in calls]
        for name, module, _, call in layers:
            if tuple(t._version for t in (*call.inputs, call.output)) != call.versions:
                raise RuntimeError(f"layer {name!r} ({type(module).__name__}): its input or output was modified "
                                   "in place after the forward; per-example gradients would be wrong")
        # Only activation gradients are requested, so autograd never computes a (non-private) weight gradient.
        grad_outputs = torch.autograd.grad(loss, [call.output for *_, call in layers], allow_unused=True)
        # Per-example norms, clipping and sums in float32 (activations may be bfloat16 under autocast): the
        # clipping bound is what the privacy accounting relies on.
        with torch.autocast(loss.device.type, enabled=False):
            gradients = [
                (module, rule(module, tuple(at_least_float32(t) for t in call.inputs), at_least_float32(grad_output)))
                for (_, module, rule, call), grad_output in zip(layers, grad_outputs)
                if grad_output is not None
            ]
            self._add_clipped_sums(gradients, labels.shape[0], clip_norm, loss, into, scale)
        return into

    def _add_clipped_sums(self, gradients, batch: int, clip_norm: float, loss, into, scale: float) -> None:
        grams = PerInput(_gram, [a for _, layer in gradients for a in layer.gram_inputs()])
        squared = torch.zeros(batch, dtype=loss.dtype, device=loss.device)
        for _, layer in gradients:
            squared = squared + layer.squared_norms(grams)
        factors = clip_factors(squared, clip_norm) * scale  # scale * sum_i c_i g_i: the same products
        scaled = PerInput(lambda x: x * factors[:, None, None],
                          [x for _, layer in gradients for x in layer.scaled_inputs()])
        target = {id(p): tensor for p, tensor in zip(self.params, into)}
        for module, layer in gradients:
            out = {name: target[id(p)] for name, p in module.named_parameters(recurse=False) if id(p) in target}
            layer.add_clipped_sums(factors, out, scaled)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def make_clipper(model: nn.Module, strategy: str, autocast=contextlib.nullcontext):
    """The per-example clipped-gradient oracle for `model` by `strategy` (one of STRATEGIES); `autocast` is the
    forward's precision context (Backbone.autocast)."""
    if strategy in ("functorch", "hooks"):
        return OpacusClipper(model, strategy, autocast)
    if strategy == "bookkeeping":
        return BookKeepingClipper(model, autocast)
    raise ValueError(f"unknown per_sample_gradients strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
