"""What every backbone is: a pretrained network split into a frozen public trunk and a trainable top.

Fine-tuning trains only the *top* (the last blocks, plus a per-task head kept outside the backbone); the
*trunk* stays at the public pretrained weights. Because the trunk is public and never changes, its outputs are
computed once per task (stage `prepare`) and every fine-tune, merge and evaluation starts from those cached
features. With `trainable_blocks: all` the trunk shrinks to the input stem or the embeddings and the whole
network is fine-tuned, as in the paper.

Parameter names in task vectors are the names in the original architecture (timm / transformers / open_clip),
so a task vector can be read by other tools. Merging touches only the top's parameters: the shared encoder is
merged, each task keeps its own head ("When Privacy Hurts Mergeability", arXiv 2608.26655, App. B.2).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
from torch import nn

PRECISIONS = ("fp32", "bf16")


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


def task_model_weights(w0: dict[str, torch.Tensor], vector: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The top weights w0 + tau of the model a task vector (or a merged vector) stands for, over w0's names.

    The one place a model is rebuilt from w0 and a vector, so every stage scores, measures and computes
    statistics of the same tensors: plain `w0 + tau` per name (torch's type promotion, no cast; a caller that
    must store at w0's precision casts tau first, as the streamed merge does).
    """
    return {name: w0[name] + vector[name] for name in w0}


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
    # How DP training gets per-example clipped gradients (training/persample.py). Book-keeping was fastest for every
    # backbone in bench/dp_step.py (docs/performance.md, "The DP step"); a backbone whose layers it cannot handle
    # overrides this.
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
        gradient norms, clipping and noise stay float32 (the losses are computed in float32, see models/losses.py), so
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
        """Merge statistics (privacy/statistics.py) computed on `network` layers -> released names."""
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


def freeze_all_but(network: nn.Module, trainable: list[nn.Module]) -> None:
    network.requires_grad_(False)
    for module in trainable:
        module.requires_grad_(True)




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
        freeze_all_but(self.network, list(self.network.encoder.layer[self.first_trainable_layer :]))

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
