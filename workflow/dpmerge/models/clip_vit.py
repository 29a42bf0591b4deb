"""open_clip's ViT image tower rebuilt from layers whose per-example gradients are exact and fast.

Why not simply let Opacus fix the model: open_clip's attention is ``nn.MultiheadAttention(batch_first=True)``,
and Opacus 1.6's replacement, ``DPMultiheadAttention``, computes a different function in batch-first mode (its
final ``attn_output.view(bsz, tgt_len, embed_dim)`` reads the (batch*heads, tokens, head_dim) result in the
wrong order, mixing heads and tokens; max output difference ~1.4 measured on ViT-S-32,
tests/test_clip_vit.py shows it on a tiny model). Privacy rule 5: a layer swapped for DP must compute what the
original computed, so we swap it for `LinearAttention` and check the whole tower on a probe when converting.

`convert_visual` returns a `DPVisionTransformer` in which every trainable tensor lives in a layer type that all
three per-sample strategies of training/persample.py ("bookkeeping", "functorch", "hooks") handle natively:

- attention: q, k, v and the output projection as four ``nn.Linear`` (open_clip packs q/k/v into one
  ``in_proj_weight``), then ``F.scaled_dot_product_attention``;
- the raw ``nn.Parameter``s of open_clip's VisionTransformer, whose per-example gradients exist only after the
  batch broadcast: ``class_embedding`` and ``positional_embedding`` become ``nn.Embedding`` tables looked up
  with per-example (constant) indices, ``proj`` a bias-free ``nn.Linear`` (x @ proj == Linear with weight proj^T);
- open_clip's ``LayerNorm`` / ``LayerNormFp32`` subclasses become plain ``nn.LayerNorm`` (the same function in
  float32) because training/persample.py and Opacus pick their fast rules by exact type.

The one exception is LayerScale (``ls_init_value`` set; none of the pretrained CLIP ViT-B/L towers use it): it
stays open_clip's module, which "bookkeeping" (per-layer vmap fallback) and "functorch" handle and Opacus
"hooks" does not.

Task vectors are written under open_clip's own names and shapes (`to_open_clip_state_dict`,
`from_open_clip_state_dict`), so they can be read by, and taken from, other tools:

    converted (this module)                           open_clip visual.*
    class_embedding.weight        [1, width]          class_embedding        [width]
    positional_embedding.weight   [tokens, width]     positional_embedding   [tokens, width]
    proj.weight                   [out_dim, width]    proj                   [width, out_dim]  (transposed)
    transformer.resblocks.{i}.attn.{q,k,v}.weight     transformer.resblocks.{i}.attn.in_proj_weight  cat(q,k,v)
    transformer.resblocks.{i}.attn.{q,k,v}.bias       transformer.resblocks.{i}.attn.in_proj_bias    cat(q,k,v)
    everything else (conv1, ln_pre, ln_*, mlp.*, attn.out_proj.*, ls_*.gamma, ln_post): the same name.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

_QKV = re.compile(r"^(?P<block>.*\.attn)\.(?P<which>[qkv])\.(?P<kind>weight|bias)$")
# Loose parameters come first in open_clip's state dict (registered directly on VisionTransformer).
_LOOSE = {"class_embedding.weight": "class_embedding", "positional_embedding.weight": "positional_embedding",
          "proj.weight": "proj"}


class LinearAttention(nn.Module):
    """Multi-head self-attention from four ``nn.Linear``: a drop-in for ``nn.MultiheadAttention(batch_first=True)``.

    Exists because Opacus's ``DPMultiheadAttention`` is wrong for batch-first inputs (module docstring). With
    plain Linear layers every strategy in training/persample.py computes per-example gradients exactly; attention itself
    has no parameters and runs in ``F.scaled_dot_product_attention``.

    ``attn_mask`` follows ``nn.MultiheadAttention``: shape (L, S) or (N * heads, L, S); boolean True means "may
    not attend", a float mask is added to the attention logits.
    """

    def __init__(self, width: int, heads: int, bias: bool = True):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by {heads} heads")
        self.heads = heads
        self.q = nn.Linear(width, width, bias=bias)
        self.k = nn.Linear(width, width, bias=bias)
        self.v = nn.Linear(width, width, bias=bias)
        self.out_proj = nn.Linear(width, width, bias=bias)

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention) -> "LinearAttention":
        unsupported = {
            "batch_first=False": not mha.batch_first,
            "separate k/v dimensions": not mha._qkv_same_embed_dim,
            "add_bias_kv": mha.bias_k is not None,
            "add_zero_attn": mha.add_zero_attn,
            f"dropout={mha.dropout}": mha.dropout != 0.0,
        }
        if any(unsupported.values()):
            raise ValueError(f"nn.MultiheadAttention with {', '.join(k for k, v in unsupported.items() if v)} "
                             "is not supported by LinearAttention")
        attn = cls(mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None)
        attn.to(dtype=mha.in_proj_weight.dtype, device=mha.in_proj_weight.device)
        with torch.no_grad():
            for layer, weight in zip((attn.q, attn.k, attn.v), mha.in_proj_weight.chunk(3)):
                layer.weight.copy_(weight)
            if mha.in_proj_bias is not None:
                for layer, bias in zip((attn.q, attn.k, attn.v), mha.in_proj_bias.chunk(3)):
                    layer.bias.copy_(bias)
            attn.out_proj.weight.copy_(mha.out_proj.weight)
            if attn.out_proj.bias is not None:
                attn.out_proj.bias.copy_(mha.out_proj.bias)
        for layer in (attn.q, attn.k, attn.v):
            layer.requires_grad_(mha.in_proj_weight.requires_grad)
        attn.out_proj.requires_grad_(mha.out_proj.weight.requires_grad)
        return attn

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, tokens, width = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, L, W) -> (B, heads, L, W / heads)
            return t.reshape(batch, tokens, self.heads, width // self.heads).transpose(1, 2)

        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:  # MHA's True = masked; SDPA's boolean True = kept
                attn_mask = torch.zeros(attn_mask.shape, dtype=x.dtype, device=x.device).masked_fill(
                    attn_mask, float("-inf"))
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.reshape(batch, self.heads, tokens, -1)
        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                             attn_mask=attn_mask)
        return self.out_proj(out.transpose(1, 2).reshape(batch, tokens, width))


class ResidualAttentionBlock(nn.Module):
    """open_clip's pre-norm block (same parameter names) around `LinearAttention`."""

    def __init__(self, block):
        super().__init__()
        from open_clip.transformer import ResidualAttentionBlock as OpenClipBlock

        if type(block) is not OpenClipBlock or hasattr(block, "ln_1_kv"):
            raise ValueError(f"only open_clip's default self-attention block is supported, got {type(block).__name__}"
                             " (custom blocks: qk_norm, scaled_cosine_attn, scale_* options)")
        self.ln_1 = _plain_norm(block.ln_1)
        self.attn = LinearAttention.from_multihead_attention(block.attn)
        self.ls_1 = _out_of_place(block.ls_1)
        self.ln_2 = _plain_norm(block.ln_2)
        self.mlp = copy.deepcopy(block.mlp)
        for name in ("c_fc", "c_proj"):
            if type(getattr(self.mlp, name)) is not nn.Linear:
                raise ValueError(f"mlp.{name} is {type(getattr(self.mlp, name)).__name__}, expected nn.Linear")
        self.ls_2 = _out_of_place(block.ls_2)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        # open_clip casts the mask to the activations' dtype before attention (a boolean mask becomes 0/1
        # additive); done here too so masked calls stay the same function as the original.
        attn_mask = attn_mask.to(x.dtype) if attn_mask is not None else None
        x = x + self.ls_1(self.attn(self.ln_1(x), attn_mask))
        return x + self.ls_2(self.mlp(self.ln_2(x)))


class Transformer(nn.Module):
    """Holds ``resblocks`` so that parameter names stay open_clip's (``transformer.resblocks.{i}...``)."""

    def __init__(self, transformer):
        super().__init__()
        if not transformer.batch_first:
            raise ValueError("only batch-first open_clip transformers are supported")
        self.resblocks = nn.ModuleList(ResidualAttentionBlock(block) for block in transformer.resblocks)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x, attn_mask)
        return x


class DPVisionTransformer(nn.Module):
    """open_clip's ``VisionTransformer`` forward, with every trainable tensor in an Opacus-supported layer.

    Split for a frozen trunk / trainable top (models/base.py): ``embed`` -> ``blocks(x, start, stop)`` -> ``pool``.
    """

    def __init__(self, visual):
        super().__init__()
        unsupported = {
            "attentional_pool": visual.attn_pool is not None,
            f"pool_type={visual.pool_type!r}": visual.pool_type not in ("tok", "avg"),
        }
        if any(unsupported.values()):
            raise ValueError(f"open_clip VisionTransformer with {', '.join(k for k, v in unsupported.items() if v)} "
                             "is not supported")
        width = visual.class_embedding.shape[0]
        self.pool_type = visual.pool_type
        self.final_ln_after_pool = visual.final_ln_after_pool
        self.output_tokens = visual.output_tokens
        self.conv1 = copy.deepcopy(visual.conv1)
        self.class_embedding = _embedding_of(visual.class_embedding.reshape(1, width),
                                             visual.class_embedding.requires_grad)
        self.positional_embedding = _embedding_of(visual.positional_embedding,
                                                  visual.positional_embedding.requires_grad)
        self.patch_dropout = copy.deepcopy(visual.patch_dropout)
        self.ln_pre = _plain_norm(visual.ln_pre)
        self.transformer = Transformer(visual.transformer)
        self.ln_post = _plain_norm(visual.ln_post)
        if visual.proj is None:  # pruned head: the pooled width is the output
            self.proj = None
        else:
            self.proj = nn.Linear(*visual.proj.shape, bias=False).to(visual.proj)
            with torch.no_grad():
                self.proj.weight.copy_(visual.proj.T)
            self.proj.requires_grad_(visual.proj.requires_grad)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) -> tokens (B, 1 + patches, width) entering the first block."""
        x = self.conv1(images)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        batch, patches = x.shape[0], x.shape[1]
        # Per-example indices (constant) give the tables a batch dimension, so their per-example gradients
        # are an ordinary embedding rule instead of a broadcast no strategy can split.
        cls_ids = torch.zeros(batch, 1, dtype=torch.long, device=x.device)
        pos_ids = torch.arange(patches + 1, device=x.device).expand(batch, -1)
        x = torch.cat([self.class_embedding(cls_ids).to(x.dtype), x], dim=1)
        x = x + self.positional_embedding(pos_ids).to(x.dtype)
        return self.ln_pre(self.patch_dropout(x))

    def blocks(self, x: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        for block in self.transformer.resblocks[start:stop]:
            x = block(x)
        return x

    def pool(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Last block's tokens -> projected image embedding (plus the other tokens if ``output_tokens``)."""
        if not self.final_ln_after_pool:
            x = self.ln_post(x)
        pooled, tokens = (x[:, 1:].mean(dim=1), x[:, 1:]) if self.pool_type == "avg" else (x[:, 0], x[:, 1:])
        if self.final_ln_after_pool:
            pooled = self.ln_post(pooled)
        if self.proj is not None:
            pooled = self.proj(pooled)
        return (pooled, tokens) if self.output_tokens else pooled

    def forward(self, images: torch.Tensor):
        return self.pool(self.blocks(self.embed(images)))


def _embedding_of(table: torch.Tensor, requires_grad: bool) -> nn.Embedding:
    embedding = nn.Embedding(*table.shape).to(table)
    with torch.no_grad():
        embedding.weight.copy_(table)
    embedding.weight.requires_grad_(requires_grad)
    return embedding


def _plain_norm(norm: nn.Module) -> nn.Module:
    """open_clip's LayerNorm subclasses -> nn.LayerNorm (training/persample.py and Opacus match layer rules by
    exact type)."""
    if isinstance(norm, nn.Identity):
        return nn.Identity()
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"unsupported norm layer {type(norm).__name__}")
    plain = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, elementwise_affine=norm.elementwise_affine,
                         bias=norm.bias is not None)
    if norm.elementwise_affine:
        plain.to(norm.weight)
        plain.load_state_dict(norm.state_dict())
        plain.requires_grad_(norm.weight.requires_grad)
    return plain


def _out_of_place(layer_scale: nn.Module) -> nn.Module:
    # An in-place LayerScale would overwrite the attention output that book-keeping recorded.
    layer_scale = copy.deepcopy(layer_scale)
    if hasattr(layer_scale, "inplace"):
        layer_scale.inplace = False
    return layer_scale


@torch.no_grad()
def max_output_difference(visual: nn.Module, converted: nn.Module, images: torch.Tensor) -> float:
    """Largest |original - converted| over the image embeddings of `images`, both in eval mode."""
    modes = visual.training, converted.training
    visual.eval(), converted.eval()
    try:
        before, after = visual(images), converted(images)
    finally:
        visual.train(modes[0]), converted.train(modes[1])
    if isinstance(before, tuple):
        return max((b - a).abs().max().item() for b, a in zip(before, after))
    return (before - after).abs().max().item()


def convert_visual(visual, atol: float = 1e-4) -> DPVisionTransformer:
    """The DP-friendly equivalent of open_clip's ``VisionTransformer`` (weights and requires_grad copied).

    Args:
        visual: ``model.visual`` of an open_clip CLIP with a ViT image tower (default attention blocks).
        atol: largest image-embedding difference on a random probe batch accepted as "the same function"
            (privacy rule 5); raises RuntimeError beyond it. The float32 difference is ~1e-6.

    Returns:
        A `DPVisionTransformer` in the same train/eval mode and dtype as `visual`; `visual` is not modified.
    """
    converted = DPVisionTransformer(visual).train(visual.training)
    height, width = visual.image_size
    probe = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(0))
    probe = probe.to(visual.conv1.weight)
    difference = max_output_difference(visual, converted, probe)
    if not difference <= atol:
        raise RuntimeError(f"converted open_clip ViT differs from the original by {difference:.2e} (> {atol:g})")
    return converted


def to_open_clip_state_dict(
    source: nn.Module | Mapping[str, torch.Tensor], prefix: str = "",
) -> dict[str, torch.Tensor]:
    """Converted names/shapes -> open_clip's ``VisionTransformer`` names/shapes (see the table in the module doc).

    Args:
        source: a `DPVisionTransformer`, or a state dict in its names, possibly a subset (e.g. the trainable top
            of a fine-tune); a block's q, k and v must then be present together, as they form one open_clip tensor.
        prefix: prepended to every output key, e.g. ``"visual."`` for a whole CLIP model's names.

    Returns:
        New tensors (never views of `source`), in open_clip's key order for a whole model.
    """
    state = source.state_dict() if isinstance(source, nn.Module) else dict(source)
    loose = [(name, state[name]) for name in _LOOSE if name in state]
    rest = [(name, value) for name, value in state.items() if name not in _LOOSE]
    out: dict[str, torch.Tensor] = {}
    for name, value in loose + rest:
        if name == "class_embedding.weight":
            out[prefix + "class_embedding"] = value.reshape(-1).clone()
        elif name == "proj.weight":
            out[prefix + "proj"] = value.T.contiguous()
        elif (match := _QKV.match(name)) is not None:
            key = f"{prefix}{match['block']}.in_proj_{match['kind']}"
            if key in out:
                continue
            parts = [f"{match['block']}.{which}.{match['kind']}" for which in "qkv"]
            missing = [part for part in parts if part not in state]
            if missing:
                raise ValueError(f"{missing[0]!r} is missing: q, k and v together form open_clip's {key!r}")
            out[key] = torch.cat([state[part] for part in parts])
        else:
            out[prefix + _LOOSE.get(name, name)] = value.clone()
    return out


def from_open_clip_state_dict(
    state: Mapping[str, torch.Tensor], converted: DPVisionTransformer, prefix: str = "", partial: bool = False,
) -> dict[str, torch.Tensor]:
    """open_clip ``VisionTransformer`` names/shapes -> `converted`'s names/shapes, checked first.

    Args:
        state: open_clip tensors (``model.visual.state_dict()``, or a CLIP state dict with ``prefix="visual."``).
        converted: the model whose layout the tensors must fit.
        prefix: the prefix every key of `state` carries.
        partial: accept a subset of the keys (a task vector of the trainable top); otherwise all are required.

    Returns:
        New tensors under `converted`'s names (``converted.load_state_dict`` takes them when ``partial`` is off).

    Raises:
        ValueError naming the first mismatching key: one `converted` does not have, one with another shape, or
        (unless ``partial``) the first of `converted`'s keys that `state` lacks.
    """
    # Shapes only (meta tensors): this runs on every load of a task vector and inside curvature's loss.
    expected = to_open_clip_state_dict({name: value.to("meta") for name, value in converted.state_dict().items()})
    for key, value in state.items():
        name = key[len(prefix):] if key.startswith(prefix) else None
        if name not in expected:
            raise ValueError(f"unexpected key {key!r}: not a tensor of this open_clip ViT"
                             + (f" (keys must start with {prefix!r})" if name is None else ""))
        if tuple(value.shape) != tuple(expected[name].shape):
            raise ValueError(f"key {key!r} has shape {tuple(value.shape)}, expected {tuple(expected[name].shape)}")
    if not partial:
        for name in expected:
            if prefix + name not in state:
                raise ValueError(f"missing key {prefix + name!r}")
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key[len(prefix):]
        if name == "class_embedding":
            out["class_embedding.weight"] = value.reshape(1, -1).clone()
        elif name == "proj":
            out["proj.weight"] = value.T.contiguous()
        elif name.endswith((".attn.in_proj_weight", ".attn.in_proj_bias")):
            block, kind = name.rsplit(".in_proj_", 1)
            for which, part in zip("qkv", value.chunk(3)):
                out[f"{block}.{which}.{kind}"] = part.clone()
        else:
            out[name + ".weight" if name == "positional_embedding" else name] = value.clone()
    return out
