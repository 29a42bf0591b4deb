"""Random-init models with the paper's backbone shapes (ViT-B/32, RoBERTa-base) for benchmarks and DP tests.

The architectures are the real ones (timm's VisionTransformer, transformers' RobertaForSequenceClassification),
only the weights are random: nothing can be downloaded here. Keyword overrides shrink them for tests.
"""

from __future__ import annotations

import torch
from torch import nn

from dpmerge.runtime import make_torchvision_importable


class ClassTokenAndPositions(nn.Module):
    """Prepends the learned class token and adds learned position embeddings (a ViT's only loose parameters).

    As a module of its own it gets per-example gradients like any other layer; as bare parameters of the whole
    VisionTransformer it would not (their per-example gradients exist only after the batch broadcast).
    """

    def __init__(self, class_token: nn.Parameter, positions: nn.Parameter):
        super().__init__()
        self.class_token = class_token
        self.positions = positions

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.class_token.expand(patches.shape[0], -1, -1), patches], dim=1) + self.positions


def _with_token_module(vit) -> nn.Module:
    """Move timm ViT's cls_token / pos_embed into a ClassTokenAndPositions child; outputs checked unchanged."""
    if vit.reg_token is not None or vit.no_embed_class or vit.dynamic_img_size or vit.cls_token is None:
        raise ValueError("only the original ViT token layout (class token, then positions over all tokens)")
    probe = torch.randn(2, 3, *vit.patch_embed.img_size, generator=torch.Generator().manual_seed(0))
    was_training = vit.training
    vit.eval()
    with torch.no_grad():
        before = vit(probe)
    tokens = ClassTokenAndPositions(vit.cls_token, vit.pos_embed)
    del vit.cls_token, vit.pos_embed
    vit.cls_token, vit.pos_embed = None, None
    vit.token_embedding = tokens
    vit._pos_embed = lambda x: vit.pos_drop(vit.token_embedding(x))
    with torch.no_grad():
        after = vit(probe)
    vit.train(was_training)
    if not torch.allclose(before, after, atol=1e-6):  # rule 5: a swapped layer must compute the same function
        raise AssertionError("ClassTokenAndPositions changed the ViT's outputs")
    return vit


def vit_b32_shaped(num_classes: int = 10, seed: int = 0, **overrides):
    """ViT-B/32 (224 px, 12 x 768, 88M parameters) with random weights; returns (model, make_batch)."""
    from dpmerge.runtime import make_torchvision_importable

    make_torchvision_importable()  # timm imports torchvision, which needs its op schemas beside this torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    shape = dict(img_size=224, patch_size=32, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0)
    shape.update(overrides)
    model = _with_token_module(VisionTransformer(num_classes=num_classes, **shape))
    model.train()

    def make_batch(batch_size: int, generator: torch.Generator):
        images = torch.randn(batch_size, 3, shape["img_size"], shape["img_size"], generator=generator)
        return (images,), torch.randint(0, num_classes, (batch_size,), generator=generator)

    return model, make_batch


def roberta_base_shaped(num_classes: int = 2, seq_len: int = 128, seed: int = 0, **overrides):
    """RoBERTa-base (12 x 768, 125M parameters incl. the 50k-token embedding) with random weights, dropout off."""
    make_torchvision_importable()
    from transformers import RobertaConfig, RobertaForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    shape = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=num_classes)
    shape.update(overrides)
    network = RobertaForSequenceClassification(RobertaConfig(**shape))
    network.train()
    vocab = network.config.vocab_size

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.network = network

        def forward(self, input_ids):
            mask = (input_ids != network.config.pad_token_id).long()
            return self.network(input_ids=input_ids, attention_mask=mask).logits

    def make_batch(batch_size: int, generator: torch.Generator):
        ids = torch.randint(3, vocab, (batch_size, seq_len), generator=generator)
        ids[:, 0] = 0  # <s>
        ids[:, -seq_len // 4 :] = network.config.pad_token_id  # padding, as real batches have
        return (ids,), torch.randint(0, num_classes, (batch_size,), generator=generator)

    return Classifier(), make_batch
