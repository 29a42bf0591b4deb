"""Tiny random-weight stand-ins for the paper's backbones, saved in the real checkpoint formats.

This machine can fetch no CLIP or RoBERTa weights, so the paper's loading code (models/clip.py,
models/roberta.py) is exercised on models of the same architectures, built here and written the way the real
ones are distributed: an open_clip model-config JSON plus a CLIP state dict (`torch.save`, the format of
open_clip's `open_clip_pytorch_model.bin`), and a RoBERTa directory written by `save_pretrained` (config.json,
model.safetensors, a byte-level BPE tokenizer's vocab.json/merges.txt). Together with data/standins.py's write_standin
they make presets/standin.yaml, which runs the paper's DAG end to end in CI (`dpmerge make-standins`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dpmerge.runtime import make_torchvision_importable

TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 16, "patch_size": 8},
    # The real BPE vocabulary, so open_clip's own tokenizer serves the stand-in as it serves ViT-B/32.
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
TINY_CLIP_NAME = "tiny-standin-ViT"


def write_tiny_clip(directory: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """A 2-block ViT CLIP with random weights: (model config JSON, checkpoint). Idempotent for a seed."""
    make_torchvision_importable()
    import open_clip

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{TINY_CLIP_NAME}.json"
    config.write_text(json.dumps(TINY_CLIP_CONFIG, indent=2) + "\n")
    open_clip.add_model_config(config)
    torch.manual_seed(seed)
    model = open_clip.create_model(TINY_CLIP_NAME, pretrained=None)
    checkpoint = directory / "open_clip_pytorch_model.bin"
    torch.save(model.state_dict(), checkpoint)
    return config, checkpoint


def write_tiny_roberta(directory: str | Path, corpus: list[str], seed: int = 0) -> Path:
    """A 2-layer RoBERTa (hidden 32) with random weights and a byte-level BPE tokenizer trained on `corpus`."""
    from tokenizers import ByteLevelBPETokenizer
    make_torchvision_importable()
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(directory))
    tokenizer = RobertaTokenizerFast(vocab_file=str(directory / "vocab.json"),
                                     merges_file=str(directory / "merges.txt"), model_max_length=64)
    tokenizer.save_pretrained(directory)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=72, type_vocab_size=1,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    RobertaModel(config, add_pooling_layer=False).save_pretrained(directory)
    return directory
