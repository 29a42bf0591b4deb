"""Per-example clipped gradient sums: every strategy against a per-example loop on the paper's architectures."""

import pytest
import torch
from torch import nn

from brute_force import (
    assert_matches_brute_force,
    per_example_norms,
)
from dpmerge.models.reference_shapes import ClassTokenAndPositions, roberta_base_shaped, vit_b32_shaped
from dpmerge.training import persample
from dpmerge.training.finetune import FinetuneConfig
from dpmerge.training.persample import STRATEGIES, BookKeepingClipper, _linear_weight_squared_norms, make_clipper


def tiny_vit():
    return vit_b32_shaped(num_classes=3, img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2)


def tiny_roberta():
    return roberta_base_shaped(
        num_classes=3, seq_len=12, vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=40,
    )


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("clip", ["all clipped", "median", "none clipped"])
@pytest.mark.parametrize("build", [tiny_vit, tiny_roberta], ids=["vit", "roberta"])
def test_every_strategy_matches_per_example_loop_on_reference_architectures(build, clip, strategy):
    """Covers conv patch embedding, class token/positions, fused qkv, layer norms, padded token embeddings."""
    model, make_batch = build()
    features, labels = make_batch(5, torch.Generator().manual_seed(1))
    norms = per_example_norms(model, features, labels)
    clip_norm = {"all clipped": min(norms) / 10, "median": sorted(norms)[2], "none clipped": max(norms) * 10}[clip]
    assert_matches_brute_force(model, features, labels, clip_norm, strategy)


def test_padding_tokens_get_no_embedding_gradient():
    model, make_batch = tiny_roberta()
    features, labels = make_batch(4, torch.Generator().manual_seed(2))
    clipper = BookKeepingClipper(model)
    sums = dict(zip([n for n, p in model.named_parameters() if p.requires_grad],
                    clipper.clipped_sum(features, labels, 1.0)))
    pad = model.network.config.pad_token_id
    assert torch.equal(sums["network.roberta.embeddings.word_embeddings.weight"][pad], torch.zeros(32))


def test_ghost_norm_and_instantiated_norm_agree():
    generator = torch.Generator().manual_seed(0)
    a, g = torch.randn(3, 7, 5, generator=generator), torch.randn(3, 7, 4, generator=generator)
    explicit = torch.stack([(g[i].T @ a[i]).pow(2).sum() for i in range(3)])
    # 7 tokens x (5 + 4) > 5 x 4: instantiation; 2 tokens: ghost; 1 token: product of norms
    assert torch.allclose(_linear_weight_squared_norms(a, g), explicit)
    for tokens in (1, 2):
        explicit = torch.stack([(g[i, :tokens].T @ a[i, :tokens]).pow(2).sum() for i in range(3)])
        got = _linear_weight_squared_norms(a[:, :tokens], g[:, :tokens])
        assert torch.allclose(got, explicit, atol=1e-5)


def test_query_key_and_value_share_one_gram_and_one_scaled_copy_of_their_input(monkeypatch):
    model, make_batch = tiny_roberta()  # 2 layers; hidden 32, 12 tokens: every token linear takes the ghost norm
    features, labels = make_batch(4, torch.Generator().manual_seed(3))
    clip_norm = sorted(per_example_norms(model, features, labels))[1]  # some examples clipped, some not
    unshared = BookKeepingClipper(model)
    with monkeypatch.context() as patch:  # every reader computes its own, as before sharing
        patch.setattr(persample.PerInput, "__call__", lambda self, x: self._function(x))
        expected = unshared.clipped_sum(features, labels, clip_norm)
    unshared.close()

    # what each computation was given, kept alive so that no two of them can share an address
    computed = {"gram": [], "scaled": []}
    real_gram, real_init = persample._gram, persample.PerInput.__init__

    def counting_gram(x):
        computed["gram"].append(x)
        return real_gram(x)

    def counting_init(self, function, readers):
        real_init(self, function, readers)
        if function is not counting_gram:  # the clip factors' scaling
            self._function = lambda x: computed["scaled"].append(x) or function(x)

    monkeypatch.setattr(persample, "_gram", counting_gram)
    monkeypatch.setattr(persample.PerInput, "__init__", counting_init)
    clipper = BookKeepingClipper(model)
    sums = clipper.clipped_sum(features, labels, clip_norm)
    assert all(torch.equal(s, e) for s, e in zip(sums, expected, strict=True))
    distinct = {kind: {persample._identity(x) for x in given} for kind, given in computed.items()}
    # per layer, Grams of 6 output gradients and of 4 distinct inputs (query, key and value read one tensor);
    # one more per embedding table (of its output gradient)
    embeddings = sum(isinstance(m, nn.Embedding) and m.weight.requires_grad for m in model.modules())
    assert embeddings == 3  # words, positions, token types
    assert len(computed["gram"]) == len(distinct["gram"]) == 2 * (6 + 4) + embeddings
    # per layer, one scaled copy of each input the factors scale: 3 of its 4 distinct ones (the FFN's output
    # layer scales its smaller output gradient instead), query, key and value sharing theirs; plus the head's
    # dense layer on the class token
    assert len(computed["scaled"]) == len(distinct["scaled"]) == 2 * 3 + 1


def test_class_token_module_keeps_the_vit_function():
    """Rule 5: moving the ViT's loose parameters into a module must not change what it computes (checked on build)."""
    model, _ = tiny_vit()
    assert isinstance(model.token_embedding, ClassTokenAndPositions)
    assert model.cls_token is None and model.pos_embed is None
    names = [n for n, _ in model.named_parameters()]
    assert "token_embedding.class_token" in names and "token_embedding.positions" in names


class InPlaceAfterLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        out = self.linear(x)
        out.mul_(2.0)  # autograd handles this, but the recorded layer output is no longer what fed the loss
        return out


class SharedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(self.linear(x))


@pytest.mark.parametrize(
    "model,message", [(InPlaceAfterLinear(), "modified in place"), (SharedLinear(), "called twice")]
)
def test_bookkeeping_refuses_models_it_would_get_wrong(model, message):
    clipper = BookKeepingClipper(model)
    with pytest.raises(RuntimeError, match=message):
        clipper.clipped_sum((torch.randn(3, 4),), torch.tensor([0, 1, 2]), 1.0)


def test_empty_batch_gives_zero_sums_and_hooks_are_removed_on_close():
    model, make_batch = tiny_vit()
    features, labels = make_batch(2, torch.Generator().manual_seed(0))
    for strategy in STRATEGIES:
        clipper = make_clipper(model, strategy)
        sums = clipper.clipped_sum(tuple(f[:0] for f in features), labels[:0], 1.0)
        assert all(torch.equal(s, torch.zeros_like(s)) for s in sums)
        clipper.close()
    assert not any(m._forward_hooks or m._backward_hooks for m in model.modules())


def test_unknown_strategy_is_refused_by_name():
    with pytest.raises(ValueError, match="per_sample_gradients"):
        make_clipper(nn.Linear(2, 2), "ghosts")
    with pytest.raises(ValueError, match="per_sample_gradients"):
        FinetuneConfig(method="naive_dp", target_epsilon=1.0, per_sample_gradients="ghosts")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_clipped_sums_add_onto_the_tensors_they_are_given(strategy):
    """The DP step draws the noise first and has the clipper add the clipped sums onto it (a product with
    beta = 1 instead of a sum and a pass to add the noise): into + scale * sums (scale = 1 / B, folded into the
    clip factors), the same tensors returned."""
    model, make_batch = tiny_roberta()
    features, labels = make_batch(4, torch.Generator().manual_seed(5))
    clipper = make_clipper(model, strategy)
    try:
        expected = clipper.clipped_sum(features, labels, 0.5)
        params = [p for p in model.parameters() if p.requires_grad]
        start = [torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) for i, p in enumerate(params)]
        into = [s.clone() for s in start]
        got = clipper.clipped_sum(features, labels, 0.5, into=into, scale=0.25)
        assert all(g is i for g, i in zip(got, into, strict=True))
        for g, s, e in zip(got, start, expected):
            assert torch.allclose(g, s + 0.25 * e, atol=1e-5)
        # an empty batch adds nothing; tensors of the wrong shape are refused, not broadcast into
        assert all(torch.equal(g, s) for g, s in zip(clipper.clipped_sum(
            tuple(f[:0] for f in features), labels[:0], 0.5, into=[s.clone() for s in start]), start))
        with pytest.raises(ValueError, match="one tensor per trainable parameter"):
            clipper.clipped_sum(features, labels, 0.5, into=[s.clone() for s in start[:-1]])
        with pytest.raises(ValueError, match="one tensor per trainable parameter"):
            clipper.clipped_sum(features, labels, 0.5, into=[s.clone().reshape(-1) for s in start])
    finally:
        clipper.close()
