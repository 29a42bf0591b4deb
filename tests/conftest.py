import math
import os
import sys
import tempfile
from pathlib import Path

# Under pytest-xdist (make test runs two workers) each worker gets its own temporary folder before anything reads
# it: the fork server's socket and the GPU-slot locks live in a per-user folder there, and one worker's test that
# stops its server must not stop the other worker's workflow.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _worker_tmp = Path(tempfile.gettempdir()) / f"dpmerge-tests-{os.getuid()}-{os.environ['PYTEST_XDIST_WORKER']}"
    _worker_tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(_worker_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from dpmerge import runtime  # noqa: E402
from dpmerge.models.base import Backbone  # noqa: E402

# Fixtures every audit test module uses (a wide toy top and its study key), kept beside the toys they build; the
# suite's tiers (tiers.py: which tests start Snakemake)
pytest_plugins = ["audit_toys", "tiers"]

# The test session is where these commands start: tests that import torchvision directly need the schemas, and
# in-process fine-tunes run with the allocator the CLI uses.
runtime.make_torchvision_importable()
runtime.tune_allocator()

# Small parameter mappings for the diagnostics tests: 7 parameters split over two tensors, and their flat form
SHAPES = {"layer.weight": (2, 2), "layer.bias": (3,)}


def flat(params):
    return torch.cat([params[name].reshape(-1).double() for name in SHAPES])


def unflat(vector):
    out, start = {}, 0
    for name, shape in SHAPES.items():
        size = math.prod(shape)
        out[name] = vector[start:start + size].reshape(shape).clone()
        start += size
    return out


class ToyBackbone(Backbone):
    """A few-parameter backbone with the layer types the real ones use (depthwise conv, linear, layer norm)."""

    kind = "toy"
    modality = "vision"

    def __init__(self, checkpoint: Path, seed: int = 0):
        torch.manual_seed(seed)
        self.network = nn.Sequential(
            nn.Conv2d(2, 4, 3, groups=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16, 6),
            nn.LayerNorm(6),
        )
        self.embed_dim = 6
        checkpoint.write_bytes(b"toy weights")
        self.checkpoint_path = checkpoint

    def encode_inputs(self, inputs):
        return (torch.as_tensor(inputs, dtype=torch.float32),)

    def trunk(self, x):
        return (x,)

    def top(self, x):
        return self.network(x)


# A fixed study key keeps these tests reproducible; a real study's key comes from the OS's CSPRNG and is secret.
TEST_STUDY_KEY = bytes(range(32))


def install_test_key(results: Path) -> Path:
    """The suite's study key as a workflow's `<results>/private/study.key` (folder 0700, file 0600): the suite's
    runs are reproducible, where a study makes its own key."""
    key = Path(results) / "private" / "study.key"
    key.parent.mkdir(parents=True, mode=0o700)
    key.write_text(TEST_STUDY_KEY.hex())
    key.chmod(0o600)
    return key


def keyed(identity=None, study_key=TEST_STUDY_KEY, **names):
    """finetune()'s randomness arguments for a test: the test key and an identity (backbone, task, method)."""
    return {"study_key": study_key, "identity": identity or {"backbone": "toy", "task": "toy", **names}}


@pytest.fixture
def toy_backbone(tmp_path):
    return ToyBackbone(tmp_path / "toy.bin")


@pytest.fixture
def toy_data():
    generator = torch.Generator().manual_seed(0)
    features = (torch.randn(64, 2, 4, 4, generator=generator),)
    labels = torch.randint(0, 3, (64,), generator=generator)
    return features, labels


def build_backbones_with(monkeypatch, build) -> None:
    """Make every stage build its backbone with `build(spec)`: the stages import backbone_from_spec at their top,
    so it is replaced where each of them holds it, and at its home for anything imported later."""
    import importlib
    import pkgutil

    import dpmerge.stages

    monkeypatch.setattr("dpmerge.models.spec.backbone_from_spec", build)
    for module in pkgutil.iter_modules(dpmerge.stages.__path__):
        stage = importlib.import_module(f"dpmerge.stages.{module.name}")
        if hasattr(stage, "backbone_from_spec"):
            monkeypatch.setattr(stage, "backbone_from_spec", build)
