"""CLIP image encoders through open_clip (ViT-B/32, ViT-B/16, ViT-L/14, `openai` weights), as the paper uses them.

The visual tower is fine-tuned and merged; each task classifies with a frozen zero-shot head built from CLIP's
text encoder, the class names and the task's prompt templates (the task_vectors convention, Ilharco et al.
2023): w_c = normalise(mean_t normalise(text(template_t(class_c)))) scaled by CLIP's logit scale, applied to
the normalised image embedding. The head is computed once per (backbone, task) by `dpmerge zeroshot-head`;
it comes from public weights and public class names, so it costs no privacy.

For DP the tower is rebuilt by `clip_vit.convert_visual` (Linear-based attention, raw parameters hosted in
layers; checked equal to open_clip's on a probe), and task vectors are written under open_clip's own
`visual.*` names and shapes (`release_state`), so they add directly to an open_clip CLIP state dict.

Weights come from a local checkpoint file (`checkpoint:` in the config: an open_clip state dict in .bin/.pt/
.safetensors, or OpenAI's TorchScript archive) or, when online, open_clip's download into its cache. Either
way the file is checked key by key against the architecture and hashed into every privacy record.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dpmerge.models.base import Backbone, check_state
from dpmerge.models.clip_vit import _QKV, convert_visual, from_open_clip_state_dict, to_open_clip_state_dict
from dpmerge.runtime import make_torchvision_importable

OPEN_CLIP_NAMES = {"clip_vit_b32": "ViT-B-32", "clip_vit_b16": "ViT-B-16", "clip_vit_l14": "ViT-L-14"}
PREFIX = "visual."
# Entries of OpenAI's original checkpoints that are hyperparameters, not tensors of the model.
_OPENAI_EXTRAS = ("input_resolution", "context_length", "vocab_size")


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """A CLIP state dict from an open_clip checkpoint (.safetensors, .bin/.pt state dict, possibly wrapped in
    {"state_dict": ...} with DDP's "module." prefix) or OpenAI's TorchScript archive."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except RuntimeError as error:
        if "TorchScript" not in str(error) and "constants.pkl" not in str(error):
            raise ValueError(f"{path}: not a readable checkpoint ({error})") from error
        state = torch.jit.load(path, map_location="cpu").state_dict()
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, found {type(state).__name__}")
    if state and all(key.startswith("module.") for key in state):
        state = {key.removeprefix("module."): value for key, value in state.items()}
    return {key: value for key, value in state.items() if key not in _OPENAI_EXTRAS}



@contextlib.contextmanager
def _without_log_message(fragment: str):
    """Drop the root logger's records containing `fragment` (open_clip logs through the root logger)."""
    def keep(record: logging.LogRecord) -> bool:
        return fragment not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


class OpenCLIPViT(Backbone):
    modality = "vision"

    def __init__(self, kind: str = "clip_vit_b32", trainable_blocks: int | str = "all", checkpoint: str | None = None,
                 pretrained: str = "openai", model: str | None = None, cache_dir: str | None = None):
        make_torchvision_importable()
        import open_clip

        self.kind = kind
        if model is None:
            if kind not in OPEN_CLIP_NAMES:
                raise ValueError(f"backbone kind {kind!r} needs `model:` (an open_clip model name or config JSON)")
            model = OPEN_CLIP_NAMES[kind]
        if str(model).endswith(".json"):
            config = Path(model)
            if not config.is_file():
                raise FileNotFoundError(f"open_clip model config not found: {config}")
            open_clip.add_model_config(config)
            model = config.stem
        if model not in open_clip.list_models():
            raise ValueError(f"unknown open_clip model {model!r}; e.g. {', '.join(OPEN_CLIP_NAMES.values())}")
        self.model_name = model
        pretrained_cfg = open_clip.get_pretrained_cfg(model, pretrained) if pretrained else {}
        if checkpoint is None:
            if not pretrained_cfg:
                raise ValueError(f"open_clip has no pretrained weights {pretrained!r} for {model}; known tags: "
                                 f"{', '.join(open_clip.list_pretrained_tags_by_model(model)) or 'none'}; "
                                 "or give a local `checkpoint:`")
            try:
                checkpoint = open_clip.pretrained.download_pretrained(pretrained_cfg, cache_dir=cache_dir)
            except Exception as error:  # offline: say what to do instead of a hub traceback
                raise FileNotFoundError(
                    f"could not fetch {model} '{pretrained}' weights ({type(error).__name__}: {error}); on an offline "
                    f"machine download them elsewhere and set the backbone's `checkpoint:` to the file") from error
        self.checkpoint_path = Path(checkpoint)
        if not self.checkpoint_path.is_file():
            raise FileNotFoundError(f"CLIP checkpoint not found: {self.checkpoint_path}")
        # OpenAI's towers use QuickGELU; the tag's config says so, as open_clip's own loader reads it. Built
        # empty on purpose: the weights come from the checked checkpoint just below, so open_clip's "initialized
        # randomly" warning would be false here (and alarming in every job's log).
        with _without_log_message("initialized randomly"):
            clip = open_clip.create_model(model, pretrained=None,
                                          force_quick_gelu=bool(pretrained_cfg.get("quick_gelu")))
        if not isinstance(clip.visual, open_clip.transformer.VisionTransformer):
            raise ValueError(f"{model}'s image tower is a {type(clip.visual).__name__}, not a ViT: the CLIP kinds "
                             "fine-tune ViT towers (rebuilt for DP and checked against the original); a ResNet tower "
                             "holds BatchNorm and attention pooling they do not rebuild (kind timm reads ResNets)")
        state = read_checkpoint(self.checkpoint_path)
        expected = clip.state_dict()
        check_state(state, expected, self.checkpoint_path)
        clip.load_state_dict(state)
        clip.eval()
        self.image_size = int(clip.visual.image_size[0])
        preprocess = getattr(clip.visual, "preprocess_cfg", {}) or {}
        mean = pretrained_cfg.get("mean") or preprocess.get("mean") or open_clip.OPENAI_DATASET_MEAN
        std = pretrained_cfg.get("std") or preprocess.get("std") or open_clip.OPENAI_DATASET_STD
        self._mean = torch.tensor(mean).reshape(1, 3, 1, 1)
        self._std = torch.tensor(std).reshape(1, 3, 1, 1)
        network = convert_visual(clip.visual)  # raises if the rebuilt tower computes anything else (rule 5)
        clip.visual = nn.Identity()  # the text tower stays for zero-shot heads; the original tower is not needed
        self.clip = clip
        self.network = network
        self.embed_dim = int(network.proj.weight.shape[0]) if network.proj is not None else int(
            network.class_embedding.weight.shape[1])
        # Dropout-free and in train mode, as the other backbones: DP-SAM's two queries must see one function.
        network.train()
        num_blocks = len(network.transformer.resblocks)
        if trainable_blocks == "all":
            self.first_trainable_block, self.trunk_is_stem = 0, True
            trainable = [network]
        else:
            k = int(trainable_blocks)
            if not 1 <= k <= num_blocks:
                raise ValueError(f"trainable_blocks must be 1..{num_blocks} or 'all', got {trainable_blocks!r}")
            self.first_trainable_block, self.trunk_is_stem = num_blocks - k, False
            trainable = [network.transformer.resblocks[num_blocks - k:], network.ln_post]
            if network.proj is not None:
                trainable.append(network.proj)
        network.requires_grad_(False)
        for module in trainable:
            module.requires_grad_(True)

    def set_device(self, device: str = "auto", precision: str = "fp32") -> "OpenCLIPViT":
        super().set_device(device, precision)
        self.clip.to(self.device)  # the text tower computes the zero-shot heads
        return self

    # ----------------------------------------------------------------------------------------- data path

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        """Images [N, 3, S, S] at the tower's resolution: uint8 (kept compact; the top normalises) or float in
        [0, 1]."""
        images = torch.as_tensor(inputs)
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images [N,3,H,W], got shape {tuple(images.shape)}")
        if tuple(images.shape[2:]) != (self.image_size, self.image_size):
            raise ValueError(f"{self.model_name} takes {self.image_size}x{self.image_size} images, got "
                             f"{tuple(images.shape[2:])}: set the backbone's image_size to {self.image_size}")
        return (images if images.dtype == torch.uint8 else images.float(),)

    def _normalise(self, images: torch.Tensor) -> torch.Tensor:
        images = images.float() / 255 if images.dtype == torch.uint8 else images.float()
        return (images - self._mean.to(images.device)) / self._std.to(images.device)

    def trunk(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.trunk_is_stem:
            return (images,)
        x = self.network.blocks(self.network.embed(self._normalise(images)), 0, self.first_trainable_block)
        return (x.float(),)

    def top(self, x: torch.Tensor) -> torch.Tensor:
        net = self.network
        if self.trunk_is_stem:
            x = net.embed(self._normalise(x))
        x = net.blocks(x, self.first_trainable_block)
        # Normalised, as task_vectors' ClassificationHead normalises its input: the head is then a plain Linear.
        return F.normalize(net.pool(x).float(), dim=-1)

    # -------------------------------------------------------------------------------------- released names

    def release_state(self, internal: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return to_open_clip_state_dict(internal, prefix=PREFIX)

    def internal_state(self, released: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return from_open_clip_state_dict(released, self.network, prefix=PREFIX, partial=True)

    def release_statistics(self, kind: str, statistics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if kind != "gram":
            return self.release_state(statistics)  # diagonal Fisher: elementwise, so it maps like the weights
        released = {}
        for name, gram in statistics.items():
            if (match := _QKV.match(name)) is not None:
                # q, k and v read the same input, so their Grams are one Gram: open_clip's packed in_proj's.
                if match["which"] == "q":
                    released[f"{PREFIX}{match['block']}.in_proj_weight"] = gram
            elif name != "proj.weight":  # open_clip's proj is x @ W (transposed): RegMean averages it instead
                released[PREFIX + name] = gram
        return released

    # ------------------------------------------------------------------------------------ zero-shot heads

    @torch.no_grad()
    def zeroshot_head(self, class_names: list[str], templates) -> dict[str, torch.Tensor]:
        """task_vectors' zero-shot classifier: per class the normalised mean of the normalised text embeddings
        of its prompts, times CLIP's logit scale; no bias."""
        make_torchvision_importable()
        import open_clip

        tokenizer = open_clip.get_tokenizer(self.model_name)
        weights = []
        for name in class_names:
            texts = tokenizer([template(name) for template in templates])
            embeddings = F.normalize(self.clip.encode_text(texts.to(self.device)).float(), dim=-1)
            weights.append(F.normalize(embeddings.mean(0), dim=-1))
        weight = torch.stack(weights) * self.clip.logit_scale.exp().float()
        return {"weight": weight.cpu(), "bias": torch.zeros(len(class_names))}
