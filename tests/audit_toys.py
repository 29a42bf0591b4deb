"""Toy mechanisms for the audit tests: randomized response's scores, a wide linear top with room for
thousands of Dirac canaries, its study key and a prepared toy task."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from conftest import TEST_STUDY_KEY, build_backbones_with
from dpmerge.models.base import Backbone


def randomized_response_scores(rng, m, eps):
    """Scores of an exactly eps-DP mechanism per canary (randomized response on the coin), ties broken at random."""
    coins = rng.random(m) < 0.5
    truthful = rng.random(m) < 1 / (1 + math.exp(-eps))
    scores = np.where(coins == truthful, 1.0, -1.0) + 1e-3 * rng.random(m)
    return scores, coins


class WideTop(Backbone):
    """One linear layer of 4,352 trainable weights: room for 2,000 Dirac canaries."""

    kind = "toy"
    modality = "vision"

    def __init__(self, checkpoint: Path):
        torch.manual_seed(0)
        self.network = nn.Sequential(nn.Linear(16, 256), nn.Tanh())
        self.embed_dim = 256
        checkpoint.write_bytes(b"wide top")
        self.checkpoint_path = checkpoint

    def encode_inputs(self, inputs):
        return (torch.as_tensor(inputs),)

    def trunk(self, x):
        return (x,)

    def top(self, x):
        return self.network(x)


@pytest.fixture
def wide(tmp_path):
    generator = torch.Generator().manual_seed(0)
    features = (torch.randn(500, 16, generator=generator),)
    labels = torch.randint(0, 2, (500,), generator=generator)
    return WideTop(tmp_path / "wide.bin"), features, labels


@pytest.fixture
def study_key(tmp_path, wide, monkeypatch):
    """The stages build the wide top (whatever the spec says) and read the test key from a private file."""
    build_backbones_with(monkeypatch, lambda spec: wide[0])
    key = tmp_path / "study.key"
    key.write_text(TEST_STUDY_KEY.hex())
    key.chmod(0o600)
    return key


def prepared_task(folder, name, backbone, seed):
    from dpmerge.artifacts import save_prepared

    generator = torch.Generator().manual_seed(seed)
    save_prepared(folder / f"{name}.pt", task=name, backbone="toy", task_spec={"num_classes": 4, "metric": "accuracy"},
                  class_names=list("abcd"), train_features=(torch.randn(500, 16, generator=generator),),
                  train_labels=torch.randint(0, 4, (500,), generator=generator),
                  test_features=(torch.randn(400, 16, generator=generator),),
                  test_labels=torch.randint(0, 4, (400,), generator=generator),
                  pretrained_sha256=backbone.checkpoint_sha256)
    return str(folder / f"{name}.pt")
