"""open_clip ViT rebuilt for DP (issue 6): same function, open_clip's tensor names, exact per-example gradients."""

import copy

import pytest
import torch
from torch import nn

from brute_force import assert_matches_brute_force, per_example_norms
from dpmerge.models.clip_vit import (
    DPVisionTransformer,
    LinearAttention,
    convert_visual,
    from_open_clip_state_dict,
    max_output_difference,
    to_open_clip_state_dict,
)
from dpmerge.training.persample import STRATEGIES, _vmap, rule_for

open_clip_model = pytest.importorskip("open_clip.model")

EMBED_DIM = 32


def tiny_clip(seed: int = 0, **vision):
    """A random-weight CLIP with a 2-block ViT (width 64, 4 heads, 16 tokens + class): built locally, no download."""
    torch.manual_seed(seed)
    vision_cfg = dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32, **vision)
    text_cfg = dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1)
    return open_clip_model.CLIP(embed_dim=EMBED_DIM, vision_cfg=vision_cfg, text_cfg=text_cfg)


@pytest.fixture(scope="module")
def visual():
    return tiny_clip().visual.eval()


def images(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("vision", [{}, {"pool_type": "avg", "final_ln_after_pool": True, "ls_init_value": 0.1}],
                         ids=["clip_default", "avg_pool_layer_scale"])
def test_converted_tower_computes_open_clips_function(vision):
    """Rule 5: the swapped layers give the original's image embeddings (float32, eval mode)."""
    original = tiny_clip(**vision).visual.eval()
    converted = convert_visual(original)
    assert isinstance(converted, DPVisionTransformer)
    assert not any(isinstance(m, nn.MultiheadAttention) for m in converted.modules())
    difference = max_output_difference(original, converted, images(8))
    assert difference <= 1e-5, difference


def test_every_trainable_layer_has_a_native_per_example_rule(visual):
    """No loose parameters and no layer left to book-keeping's slow per-layer vmap fallback."""
    converted = convert_visual(visual)
    layers = {name: module for name, module in converted.named_modules()
              if any(True for _ in module.parameters(recurse=False))}
    assert sum(p.numel() for m in layers.values() for p in m.parameters(recurse=False)) == sum(
        p.numel() for p in converted.parameters())
    assert [name for name, module in layers.items() if rule_for(module) is _vmap] == []


def test_trunk_top_split_composes_to_the_forward(visual):
    converted = convert_visual(visual)
    x = images(3)
    with torch.no_grad():
        split = converted.pool(converted.blocks(converted.blocks(converted.embed(x), 0, 1), 1))
        assert torch.equal(split, converted(x))


def test_linear_attention_matches_multihead_attention_with_masks():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    attn = LinearAttention.from_multihead_attention(mha)
    x = torch.randn(3, 5, 16)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    additive = torch.randn(3 * 4, 5, 5)
    for mask in (None, causal, causal.float() * -1e4, additive):
        with torch.no_grad():
            expected = mha(x, x, x, need_weights=False, attn_mask=mask)[0]
            assert torch.allclose(attn(x, mask), expected, atol=1e-5), mask


def test_state_dict_round_trip_is_exact(visual):
    """Task vectors carry open_clip's own names, shapes and order, so other tools can read them."""
    converted = convert_visual(visual)
    reference = visual.state_dict()
    mapped = to_open_clip_state_dict(converted)
    assert list(mapped) == list(reference)
    for key, value in reference.items():
        assert mapped[key].shape == value.shape and torch.equal(mapped[key], value), key
    assert mapped["proj"].shape == (64, EMBED_DIM) and mapped["class_embedding"].shape == (64,)
    back = from_open_clip_state_dict(reference, converted)
    assert set(back) == set(converted.state_dict())
    assert all(torch.equal(value, converted.state_dict()[name]) for name, value in back.items())

    clip_state = {"visual." + k: v for k, v in reference.items()}
    assert set(to_open_clip_state_dict(converted, prefix="visual.")) == set(clip_state)
    fresh = convert_visual(tiny_clip(seed=1).visual.eval())
    fresh.load_state_dict(from_open_clip_state_dict(clip_state, fresh, prefix="visual."))
    assert max_output_difference(visual, fresh, images(2)) <= 1e-5


def test_partial_state_dict_of_the_top_round_trips(visual):
    converted = convert_visual(visual)
    top = {n: p.detach() for n, p in converted.named_parameters()
           if n.startswith(("transformer.resblocks.1.", "ln_post.", "proj."))}
    mapped = to_open_clip_state_dict(top)
    assert "transformer.resblocks.1.attn.in_proj_weight" in mapped and "proj" in mapped
    back = from_open_clip_state_dict(mapped, converted, partial=True)
    assert set(back) == set(top) and all(torch.equal(back[n], top[n]) for n in top)
    with pytest.raises(ValueError, match=r"missing key 'class_embedding'"):
        from_open_clip_state_dict(mapped, converted)
    lone_q = {"transformer.resblocks.1.attn.q.weight": top["transformer.resblocks.1.attn.q.weight"]}
    with pytest.raises(ValueError, match=r"attn\.k\.weight' is missing"):
        to_open_clip_state_dict(lone_q)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda s: s.update(proj=s["proj"].T), r"key 'proj' has shape \(32, 64\), expected \(64, 32\)"),
        (lambda s: s.update({"transformer.resblocks.0.attn.q.weight": s["conv1.weight"]}),
         r"unexpected key 'transformer\.resblocks\.0\.attn\.q\.weight'"),
        (lambda s: s.pop("ln_post.bias"), r"missing key 'ln_post\.bias'"),
        (lambda s: s.update(class_embedding=s["class_embedding"][None]), r"key 'class_embedding' has shape \(1, 64\)"),
    ],
    ids=["transposed_proj", "converted_name", "missing", "class_embedding_2d"],
)
def test_mismatching_state_dict_is_refused_naming_the_key(visual, edit, message):
    converted = convert_visual(visual)
    state = dict(visual.state_dict())
    edit(state)
    with pytest.raises(ValueError, match=message):
        from_open_clip_state_dict(state, converted)


def test_unsupported_towers_are_refused():
    with pytest.raises(ValueError, match="default self-attention block"):
        convert_visual(tiny_clip(qk_norm=True).visual)


class ImageClassifier(nn.Module):
    def __init__(self, tower: nn.Module, num_classes: int = 3):
        super().__init__()
        self.tower = tower
        self.head = nn.Linear(EMBED_DIM, num_classes)

    def forward(self, x):
        return self.head(self.tower(x))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("trainable", ["top", "all"])
def test_per_example_gradients_match_a_per_example_loop(visual, trainable, strategy):
    """Every strategy handles every trainable layer (embedding tables, q/k/v, proj) exactly."""
    converted = convert_visual(visual)
    if trainable == "top":
        converted.requires_grad_(False)
        for module in (converted.transformer.resblocks[-1], converted.ln_post, converted.proj):
            module.requires_grad_(True)
    torch.manual_seed(0)
    model = ImageClassifier(converted)
    batch, labels = images(5, seed=2), torch.tensor([0, 1, 2, 0, 1])
    # the median per-example norm as clip norm: some examples clipped, some not
    clip_norm = sorted(per_example_norms(model, (batch,), labels))[2]
    assert_matches_brute_force(model, (batch,), labels, clip_norm, strategy)


def test_opacus_dp_multihead_attention_is_not_open_clips_function(visual):
    """Why LinearAttention exists: Opacus 1.6 swaps batch-first nn.MultiheadAttention for a layer that differs."""
    from opacus.validators import ModuleValidator

    fixed = ModuleValidator.fix(copy.deepcopy(visual))
    difference = max_output_difference(visual, fixed, images(4))
    assert difference > 1e-2, (
        f"Opacus's DPMultiheadAttention now matches open_clip (difference {difference:.1e}); "
        "LinearAttention may no longer be needed"
    )
