"""RoBERTa base / large through transformers, with GLUE sequence-classification heads (paper, Sec. 6 and App. B.2).

The encoder's layers are fine-tuned and merged; each task keeps its own head, shaped as transformers'
``RobertaClassificationHead`` (dense -> tanh -> out_proj on the ``<s>`` token, names ``dense.*``/``out_proj.*``
so a head loads into ``RobertaForSequenceClassification.classifier``). STS-B gets a one-output regression
head (models/losses.py). Word/position embeddings stay frozen as for MiniLM: they are the trunk, computed once.

Weights: a local model directory (`checkpoint:` — config.json, tokenizer files and model.safetensors or
pytorch_model.bin, as ``save_pretrained`` writes them) or, when online, the hub id (FacebookAI/roberta-base,
-large) through transformers' cache. The weights file is checked key by key against the architecture and hashed
into every privacy record.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from dpmerge.models.base import TextEncoder, check_state
from dpmerge.runtime import make_torchvision_importable

HUB_IDS = {"roberta_base": "FacebookAI/roberta-base", "roberta_large": "FacebookAI/roberta-large"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Parts of pretraining / task checkpoints that are not the encoder; buffers older checkpoints saved.
_NOT_ENCODER = ("lm_head.", "classifier.", "pooler.")
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    state = {key.removeprefix("roberta."): value for key, value in state.items()}
    return {key: value for key, value in state.items() if not key.startswith(_NOT_ENCODER) and key not in _BUFFERS}


def _model_dir(kind: str, checkpoint: str | None, cache_dir: str | None) -> Path:
    if checkpoint is not None:
        return Path(checkpoint)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(HUB_IDS[kind], cache_dir=cache_dir,
                                      allow_patterns=["*.json", "*.txt", "model.safetensors", "merges.txt"]))
    except Exception as error:  # offline: say what to do instead of a hub traceback
        raise FileNotFoundError(
            f"could not fetch {HUB_IDS[kind]} ({type(error).__name__}: {error}); on an offline machine save it "
            "elsewhere with save_pretrained and set the backbone's `checkpoint:` to that directory") from error


class RoBERTa(TextEncoder):
    def __init__(self, kind: str = "roberta_base", trainable_blocks: int | str = "all", max_length: int = 128,
                 checkpoint: str | None = None, cache_dir: str | None = None):
        make_torchvision_importable()
        from transformers import AutoConfig, AutoTokenizer, RobertaModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.kind = kind
        model_dir = _model_dir(kind, checkpoint, cache_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"RoBERTa model directory {model_dir} has no config.json (expected the layout "
                                    "save_pretrained writes)")
        weights = next((model_dir / name for name in WEIGHT_FILES if (model_dir / name).is_file()), None)
        if weights is None:
            raise FileNotFoundError(f"RoBERTa weights not found in {model_dir}: "
                                    f"expected one of {', '.join(WEIGHT_FILES)}")
        self.checkpoint_path = weights
        # Dropout off (TextEncoder's docstring says why).
        config = AutoConfig.from_pretrained(model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if config.model_type != "roberta":
            raise ValueError(f"{model_dir}/config.json: model_type {config.model_type!r}, expected 'roberta'")
        network = RobertaModel(config, add_pooling_layer=False)
        state = _read_weights(weights)
        check_state(state, network.state_dict(), weights)
        network.load_state_dict(state)
        network.train()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.network = network
        self.max_length = int(max_length)
        self.embed_dim = config.hidden_size
        self._set_trainable_layers(trainable_blocks)

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        batch = self._tokenize(inputs)
        return batch["input_ids"], batch["attention_mask"]

    def _embed(self, input_ids) -> torch.Tensor:
        # RoBERTa numbers positions from padding_idx + 1 over non-padding tokens; its embeddings do that from ids.
        return self.network.embeddings(input_ids=input_ids)

    def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return hidden[:, 0]  # the <s> token, as RobertaClassificationHead reads it

    def make_head(self, num_classes: int) -> nn.Module:
        return nn.Sequential(OrderedDict(
            dense=nn.Linear(self.embed_dim, self.embed_dim), activation=nn.Tanh(),
            out_proj=nn.Linear(self.embed_dim, num_classes),
        ))

    def head_outputs(self, head: dict[str, torch.Tensor]) -> int:
        return int(head["out_proj.weight"].shape[0])
