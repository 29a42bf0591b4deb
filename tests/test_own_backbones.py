"""A researcher's own backbones (models/own.py) from files in each library's own format: a tiny BERT and its
tokenizer written by `save_pretrained` (kind hf_encoder), a tiny timm ResNet's state dict (kind timm). What DP
trains must compute what the original computes (privacy rule 6): held here against the libraries' own forward
passes, and the per-example clipped gradients against a per-example loop."""

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from brute_force import assert_matches_brute_force
from dpmerge.models.base import TaskModel
from dpmerge.models.own import fold_batchnorms_exactly
from dpmerge.models.spec import backbone_from_spec
from tiny_files import write_tiny_bert, write_tiny_resnet


def write_tiny_distilbert(folder):
    """A 2-layer DistilBERT (no encoder.layer: transformer.layer, no token types), as save_pretrained writes it."""
    from transformers import BertTokenizerFast, DistilBertConfig, DistilBertModel

    write_tiny_bert(folder)  # its tokenizer files; the model is replaced below
    for name in ("config.json", "model.safetensors"):
        (folder / name).unlink()
    torch.manual_seed(1)
    config = DistilBertConfig(vocab_size=BertTokenizerFast(str(folder / "vocab.txt")).vocab_size, dim=32,
                              n_layers=2, n_heads=2, hidden_dim=37, max_position_embeddings=64)
    DistilBertModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own_backbones")
    original = write_tiny_resnet(folder / "resnet.safetensors")
    return write_tiny_bert(folder / "bert"), folder / "resnet.safetensors", original


@pytest.fixture(scope="module")
def distilbert(tmp_path_factory):
    return write_tiny_distilbert(tmp_path_factory.mktemp("distilbert") / "distilbert")


def test_a_bert_folder_trains_its_last_layer_and_pools_the_models_own_states(own_files):
    from transformers import AutoModel

    bert, _, _ = own_files
    backbone = backbone_from_spec({"kind": "hf_encoder", "checkpoint": str(bert), "trainable_blocks": 1,
                                   "max_length": 12})
    assert backbone.layered  # its layers run one by one as the model runs them: the trunk is cached
    assert backbone.trainable_names() and all(n.startswith("encoder.layer.1.") for n in backbone.trainable_names())
    texts = ["a good film", "a dull and tiresome movie , number 7"]
    encoded = backbone.encode_inputs(texts)
    with torch.no_grad():
        ours = backbone.top(*backbone.trunk(*encoded))
        model = AutoModel.from_pretrained(bert).eval()
        states = model(input_ids=encoded[0], attention_mask=encoded[1]).last_hidden_state
    mask = encoded[1].unsqueeze(-1).float()
    torch.testing.assert_close(ours, (states * mask).sum(1) / mask.sum(1), atol=1e-5, rtol=1e-5)
    cls = backbone_from_spec({"kind": "hf_encoder", "checkpoint": str(bert), "pooling": "cls",
                              "trainable": ["encoder.layer.?.output.dense.*"]})
    assert sorted(cls.trainable_names()) == sorted(f"encoder.layer.{i}.output.dense.{p}" for i in (0, 1)
                                                   for p in ("weight", "bias"))


def test_an_encoder_of_another_family_runs_whole_and_trains_its_last_block(distilbert):
    from transformers import AutoModel

    backbone = backbone_from_spec({"kind": "hf_encoder", "checkpoint": str(distilbert), "trainable_blocks": 1,
                                   "max_length": 12})
    assert not backbone.layered
    assert backbone.trainable_names() and all(n.startswith("transformer.layer.1.") for n in backbone.trainable_names())
    encoded = backbone.encode_inputs(["a good film", "a dull and tiresome movie"])
    features = tuple(t.float() for t in backbone.trunk(*encoded))  # as prepare caches them
    with torch.no_grad():
        ours = backbone.top(*features)
        model = AutoModel.from_pretrained(distilbert).eval()
        states = model(input_ids=encoded[0], attention_mask=encoded[1]).last_hidden_state
    mask = encoded[1].unsqueeze(-1).float()
    torch.testing.assert_close(ours, (states * mask).sum(1) / mask.sum(1), atol=1e-5, rtol=1e-5)


def test_a_timm_resnet_is_folded_exactly_and_trains_its_last_stage(own_files):
    _, resnet, original = own_files
    backbone = backbone_from_spec({"kind": "timm", "model": "test_resnet", "checkpoint": str(resnet),
                                   "trainable_blocks": 1})
    assert not any(isinstance(m, nn.BatchNorm2d) for m in backbone.network.modules())
    assert backbone.trainable_names() and all(n.startswith("layer4.") for n in backbone.trainable_names())
    images = torch.rand(3, 3, 48, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = backbone.top(*backbone.trunk(*backbone.encode_inputs(images)))
        mean, std = torch.tensor(original.pretrained_cfg["mean"]), torch.tensor(original.pretrained_cfg["std"])
        theirs = original.forward_head(original.forward_features((images - mean[:, None, None])
                                                                 / std[:, None, None]), pre_logits=True)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["hf_encoder", "distilbert", "timm"])
def test_per_example_clipped_gradients_match_a_per_example_loop(own_files, distilbert, kind):
    bert, resnet, _ = own_files
    if kind in ("hf_encoder", "distilbert"):
        folder = bert if kind == "hf_encoder" else distilbert
        backbone = backbone_from_spec({"kind": "hf_encoder", "checkpoint": str(folder), "trainable_blocks": 1,
                                       "max_length": 10})
        inputs = ["a good film", "a bad movie", "wonderful and moving", "dull , tiresome"]
    else:
        backbone = backbone_from_spec({"kind": kind, "model": "test_resnet", "checkpoint": str(resnet),
                                       "trainable_blocks": 1})
        inputs = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    features = tuple(t.float() for t in backbone.trunk(*backbone.encode_inputs(inputs)))  # as prepare caches them
    model = TaskModel(backbone, 3)
    labels = torch.tensor([0, 1, 2, 1])
    assert_matches_brute_force(model, tuple(f.detach() for f in features), labels, 0.05, backbone.per_sample_strategy)


@pytest.mark.parametrize("network, message", [
    (nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.BatchNorm2d(4)), "changes the output"),
    (nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 4), nn.BatchNorm1d(4)), "is a BatchNorm1d"),
    (nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 6, 1), nn.BatchNorm2d(4)), "follows no convolution of its 4"),
])
def test_batch_norm_that_cannot_be_folded_exactly_is_refused_with_the_reason(network, message):
    with torch.no_grad():
        for module in network.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    with pytest.raises(ValueError, match=message):
        fold_batchnorms_exactly(network.eval(), "model.safetensors")


def test_what_an_own_backbone_cannot_use_is_refused_naming_it(own_files, tmp_path):
    bert, resnet, _ = own_files
    with pytest.raises(ValueError, match="trainable pattern 'decoder.*' matches no parameter"):
        backbone_from_spec({"kind": "hf_encoder", "checkpoint": str(bert), "trainable": ["decoder.*"]})
    with pytest.raises(ValueError, match=r"trainable_blocks for test_resnet must be 1..5 \(its feature stages"):
        backbone_from_spec({"kind": "timm", "model": "test_resnet", "checkpoint": str(resnet), "trainable_blocks": 9})
    with pytest.raises(ValueError, match="lacks 'conv1.0.weight'"):
        save_file({"w": torch.zeros(1)}, tmp_path / "other.safetensors")
        backbone_from_spec({"kind": "timm", "model": "test_resnet", "checkpoint": str(tmp_path / "other.safetensors")})
    with pytest.raises(FileNotFoundError, match="no config.json"):
        backbone_from_spec({"kind": "hf_encoder", "checkpoint": str(tmp_path)})


def test_a_clip_with_a_resnet_tower_is_refused_naming_what_reads_resnets(tmp_path):
    import json

    config = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": [1, 1, 1, 1], "width": 8},
              "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1}}
    (tmp_path / "tiny-RN.json").write_text(json.dumps(config))
    (tmp_path / "weights.bin").write_bytes(b"unused: refused before it is read")
    with pytest.raises(ValueError, match="image tower is a ModifiedResNet, not a ViT.*kind timm reads ResNets"):
        backbone_from_spec({"kind": "open_clip", "model": str(tmp_path / "tiny-RN.json"),
                            "checkpoint": str(tmp_path / "weights.bin"), "pretrained": ""})
