"""A researcher's own backbones, from local files: any `transformers` encoder saved with `save_pretrained`
(kind ``hf_encoder``) and any `timm` model with a local state dict (kind ``timm``).

Both are checked when they load, before anything trains (privacy rule 6: what DP trains must compute what the
original computes). A BERT-family encoder is split into a cached trunk and trained layers only where running
its layers one by one gives the model's own output on a probe (others run whole); a timm model's BatchNorm
layers, which DP cannot train through (batch statistics mix the examples of a batch), are folded into the
convolution before each when that is exact, checked on a probe, and refused with the reason otherwise.
"""

from __future__ import annotations

import fnmatch
import inspect
from pathlib import Path

import torch
from torch import nn

from dpmerge.models.base import Backbone, TextEncoder, check_state, freeze_all_but
from dpmerge.models.efficientnet import fold_batchnorm
from dpmerge.runtime import make_torchvision_importable

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Embeddings whose position ids come from the input ids (RoBERTa's padding offset); the others take them given
POSITIONS_FROM_IDS = ("roberta", "xlm-roberta", "camembert")
POOLINGS = ("mean", "cls")


def _trainable_by_patterns(network: nn.Module, patterns: list[str], where: str) -> None:
    """Freeze every parameter but those whose names match one of `patterns` (fnmatch: "encoder.layer.5.*")."""
    names = [name for name, _ in network.named_parameters()]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ValueError(f"{where}: trainable pattern {pattern!r} matches no parameter (e.g. {names[:3]})")
    for name, parameter in network.named_parameters():
        parameter.requires_grad_(any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))


class HFEncoder(TextEncoder):
    """Any transformers encoder from a save_pretrained folder with its tokenizer, dropout off, pooled by `pooling`
    (mean over tokens or the first token). `trainable_blocks` (the last layers, or "all") or `trainable` (name
    patterns) say what is fine-tuned; the input embeddings stay frozen.

    A BERT-family encoder (embeddings, encoder.layer: BERT, RoBERTa, ELECTRA, XLM-R, MiniLM, ...) is split by
    layers: the embeddings and the frozen layers are the trunk, computed once per task, if running its layers
    one by one gives the model's own output on a probe (checked at load). Any other encoder (DistilBERT,
    DeBERTa, ...) runs whole in every step on the tokens; its layers for `trainable_blocks` are its longest
    list of blocks."""

    kind = "hf_encoder"

    def __init__(self, checkpoint: str | None = None, trainable_blocks: int | str = 1, max_length: int = 32,
                 pooling: str = "mean", trainable: list[str] | None = None):
        make_torchvision_importable()
        from transformers import AutoConfig, AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        if checkpoint is None:
            raise ValueError("kind hf_encoder needs `checkpoint`: a folder written by save_pretrained (config.json, "
                             "the weights and the tokenizer's files)")
        folder = Path(checkpoint)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: no config.json (expected a folder written by save_pretrained)")
        weights = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
        if weights is None:
            raise FileNotFoundError(f"{folder}: no weights ({' or '.join(WEIGHT_FILES)})")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.checkpoint_path = weights
        config = AutoConfig.from_pretrained(folder)
        for name, value in vars(config).items():  # dropout off (TextEncoder says why), whatever the family calls it
            if "dropout" in name and isinstance(value, float):
                setattr(config, name, 0.0)
        try:  # the pooler is not used (pooling is ours); families without one take no such argument
            network = AutoModel.from_pretrained(folder, config=config, add_pooling_layer=False)
        except TypeError:
            network = AutoModel.from_pretrained(folder, config=config)
        network.train()
        self.network = network
        self.model_type = config.model_type
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.max_length = int(max_length)
        self.pooling = pooling
        self.embed_dim = config.hidden_size
        self.takes_token_types = "token_type_ids" in inspect.signature(network.forward).parameters
        self.layered = False
        self.first_trainable_layer = 0
        if hasattr(network, "embeddings") and hasattr(getattr(network, "encoder", None), "layer"):
            self.layered = self._layers_run_alone()
        if trainable is not None:
            _trainable_by_patterns(network, list(trainable), str(folder))
        elif self.layered:
            self._set_trainable_layers(trainable_blocks)
        else:
            _train_last_blocks(network, trainable_blocks, str(folder))
        network.get_input_embeddings().requires_grad_(False)

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        batch = self._tokenize(inputs)
        types = batch.get("token_type_ids")
        return batch["input_ids"], batch["attention_mask"], (types if types is not None
                                                              else torch.zeros_like(batch["input_ids"]))

    def trunk(self, input_ids, attention_mask, token_type_ids) -> tuple[torch.Tensor, ...]:
        if self.layered:
            return super().trunk(input_ids, attention_mask, token_type_ids)
        return input_ids, attention_mask, token_type_ids  # the tokens themselves: the whole model is the top

    def token_weights(self, *features: torch.Tensor) -> torch.Tensor:
        return features[1]  # the attention mask, after the hidden states or the tokens

    def top(self, *features: torch.Tensor) -> torch.Tensor:
        if self.layered:
            return super().top(*features)
        # cached features are stored as floats: the ids come back as integers here
        input_ids, attention_mask, token_type_ids = (f.long() for f in features)
        extra = {"token_type_ids": token_type_ids} if self.takes_token_types else {}
        hidden = self.network(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return self._pool(hidden, attention_mask.to(hidden.dtype))

    def _embed(self, input_ids, token_type_ids) -> torch.Tensor:
        if self.model_type in POSITIONS_FROM_IDS:
            return self.network.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        # position ids expanded to the batch, as MiniLM's: per-sample gradient code needs a batch dimension
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.network.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=positions)

    def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        weights = attention_mask.unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)

    @torch.no_grad()
    def _layers_run_alone(self) -> bool:
        """Whether running the layers one by one (the split into a cached trunk and a trained top) gives the model's
        own last hidden state on a probe; a family whose layers need more than an attention mask does not."""
        input_ids, attention_mask, token_types = self.encode_inputs(["a probe sentence", "and another, longer one"])
        extra = {"token_type_ids": token_types} if self.takes_token_types else {}
        reference = self.network(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        try:
            hidden = self._layers(self._embed(input_ids, token_types), attention_mask, 0, None)
        except (TypeError, ValueError, RuntimeError, IndexError):
            return False
        kept = attention_mask.bool()
        return bool(torch.allclose(hidden[kept], reference[kept], atol=1e-4, rtol=1e-4))


def _train_last_blocks(network: nn.Module, count, where: str) -> None:
    """Fine-tune the last `count` blocks of the network's longest list of blocks (DistilBERT's transformer.layer),
    or every parameter ("all")."""
    if count == "all":
        network.requires_grad_(True)
        return
    lists = [(name, module) for name, module in network.named_modules() if isinstance(module, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{where}: no list of blocks to count trainable_blocks in; give trainable name patterns")
    name, blocks = max(lists, key=lambda item: len(item[1]))
    if not isinstance(count, int) or not 1 <= count <= len(blocks):
        raise ValueError(f"{where}: trainable_blocks must be 1..{len(blocks)} (the blocks of {name}) or 'all', "
                         f"got {count!r}")
    freeze_all_but(network, list(blocks[len(blocks) - count:]))


class TimmModel(Backbone):
    """Any timm architecture (`model`, e.g. resnet50, vit_small_patch16_224) with a local state dict
    (`checkpoint`, .safetensors or a torch state dict file; a classifier it holds is dropped), pooled features as
    the embedding. Fine-tuned: the last `trainable_blocks` feature stages and what follows them, every parameter
    ("all"), or those matching `trainable` patterns. The images go straight in (no cached trunk): the whole
    network runs in every step."""

    kind = "timm"
    modality = "vision"

    def __init__(self, model: str | None = None, checkpoint: str | None = None, trainable: list[str] | None = None,
                 trainable_blocks: int | str = "all"):
        make_torchvision_importable()
        import timm

        if model is None or checkpoint is None:
            raise ValueError("kind timm needs `model` (a timm architecture name) and `checkpoint` (its weights file)")
        self.checkpoint_path = Path(checkpoint)
        if not self.checkpoint_path.is_file():
            raise FileNotFoundError(f"timm checkpoint not found: {self.checkpoint_path}")
        try:
            network = timm.create_model(model, pretrained=False, num_classes=0)
        except RuntimeError as error:  # timm's "Unknown model"
            raise ValueError(f"model {model!r}: {error}") from None
        state = _read_state(self.checkpoint_path)
        expected = network.state_dict()
        state = {key: value for key, value in state.items() if key in expected}  # the classifier goes
        check_state(state, expected, self.checkpoint_path)
        network.load_state_dict(state)
        network.eval()
        configuration = network.pretrained_cfg or {}
        self._mean = torch.tensor(configuration.get("mean", (0.485, 0.456, 0.406))).reshape(1, 3, 1, 1)
        self._std = torch.tensor(configuration.get("std", (0.229, 0.224, 0.225))).reshape(1, 3, 1, 1)
        fold_batchnorms_exactly(network, str(self.checkpoint_path))
        network.train()
        self.network = network
        self.embed_dim = int(network.num_features)
        if trainable is not None:
            _trainable_by_patterns(network, list(trainable), str(self.checkpoint_path))
        elif trainable_blocks == "all":
            freeze_all_but(network, [network])
        else:
            _train_last_stages(network, trainable_blocks, model)

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        images = torch.as_tensor(inputs)
        images = images.float() / 255 if images.dtype == torch.uint8 else images.to(torch.float32)
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images [N,3,H,W], got shape {tuple(images.shape)}")
        return (images,)

    def trunk(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (images,)

    def top(self, images: torch.Tensor) -> torch.Tensor:
        return self.network((images - self._mean.to(images.device)) / self._std.to(images.device))


def _train_last_stages(network: nn.Module, count, model: str) -> None:
    """Fine-tune the last `count` feature stages timm names for the architecture (its feature_info: ResNet's
    layer1-4, a ViT's blocks) and every parameter registered after them (final norms); freeze the rest."""
    stages = [info["module"] for info in getattr(network, "feature_info", [])]
    if not isinstance(count, int) or not 1 <= count <= len(stages):
        raise ValueError(f"trainable_blocks for {model} must be 1..{len(stages)} (its feature stages: "
                         f"{', '.join(stages)}) or 'all', got {count!r}")
    first = stages[-count]
    names = [name for name, _ in network.named_parameters()]
    start = next(i for i, name in enumerate(names) if name == first or name.startswith(first + "."))
    for index, (name, parameter) in enumerate(network.named_parameters()):
        parameter.requires_grad_(index >= start)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


class FoldedBatchNorm(nn.Module):
    """What stays of a BatchNorm folded into its convolution: timm's BatchNormAct2d's dropout and activation, if
    any, and a fresh tensor, never the convolution's own output: a residual block's `x += shortcut` would otherwise
    change that output in place, which per-example gradient code must see unchanged."""

    def __init__(self, drop: nn.Module | None, act: nn.Module | None):
        super().__init__()
        self.drop = drop or nn.Identity()
        self.act = act or nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.drop(x))
        return out.clone() if out is x else out


def fold_batchnorms_exactly(network: nn.Module, where: str) -> int:
    """Fold every BatchNorm2d into the convolution that comes last before it in the network's registration order
    (a conv inside a stem Sequential, then its BatchNorm, is found), then hold the network's output on a probe
    to what it was. Refused, saying why: a BatchNorm that is not 2-D, one with no convolution of its width
    before it, or a fold that changes the output (a BatchNorm that does not directly follow that conv)."""
    pairs, last_conv = [], None
    for name, module in network.named_modules():
        if isinstance(module, nn.Conv2d):
            last_conv = module
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            if not isinstance(module, nn.BatchNorm2d):
                raise ValueError(f"{where}: layer {name!r} is a {type(module).__name__}: DP cannot train through "
                                 "batch statistics, and only a BatchNorm2d after a convolution is folded")
            if last_conv is None or last_conv.out_channels != module.num_features:
                raise ValueError(f"{where}: BatchNorm {name!r} follows no convolution of its {module.num_features} "
                                 "channels to fold into, and DP cannot train through batch statistics")
            pairs.append((last_conv, name, module))
            last_conv = None
    for module in network.modules():  # in-place activations confuse per-example gradient code
        if getattr(module, "inplace", False) is True:
            module.inplace = False
    if not pairs:
        return 0
    probe = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = network(probe)
    for conv, name, norm in pairs:
        fold_batchnorm(conv, norm)
        parent_name, _, child = name.rpartition(".")
        parent = network.get_submodule(parent_name) if parent_name else network
        setattr(parent, child, FoldedBatchNorm(getattr(norm, "drop", None), getattr(norm, "act", None)))
    with torch.no_grad():
        after = network(probe)
    if not torch.allclose(reference, after, atol=1e-4, rtol=1e-4):
        raise ValueError(f"{where}: folding its {len(pairs)} BatchNorm layers into their convolutions changes the "
                         f"output (max difference {(reference - after).abs().max():.2e}): a BatchNorm does not "
                         "directly follow the convolution before it, and DP cannot train through batch statistics")
    return len(pairs)
