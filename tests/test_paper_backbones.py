"""The paper's backbones (issue 6) on tiny random-weight stand-ins saved in the real checkpoint formats: the loaders
refuse foreign checkpoints, the DP-ready networks compute what open_clip / transformers compute, task vectors use
the original tensor names, CLIP's zero-shot heads follow task_vectors, and the GPU-readiness switches behave."""

import json

import numpy as np
import pytest
import torch

from conftest import keyed
from dpmerge.metrics import score
from dpmerge.models import losses
from dpmerge.models.base import TaskModel
from dpmerge.models.registry import BACKBONES, load_backbone
from dpmerge.models.standins import TINY_CLIP_NAME, write_tiny_clip, write_tiny_roberta
from dpmerge.training.finetune import FinetuneConfig, train
from dpmerge.training.persample import make_clipper

open_clip = pytest.importorskip("open_clip")

CORPUS = ["the cat sat on the mat", "a dog ran in the park", "birds sing in the morning", "rain fell all day"] * 4


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory):
    return write_tiny_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    return write_tiny_roberta(tmp_path_factory.mktemp("roberta"), CORPUS)


def clip_backbone(clip_files, **options):
    config, checkpoint = clip_files
    return load_backbone("open_clip", model=str(config), checkpoint=str(checkpoint), pretrained="", **options)


def uint8_images(count, seed=0, size=32):
    return torch.randint(0, 256, (count, 3, size, size), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


# ------------------------------------------------------------------------------------------------- CLIP


def test_a_clip_job_logs_the_weights_it_loaded_and_not_open_clips_random_init_warning(clip_files, caplog, capsys):
    """open_clip builds the tower empty and warns that it is 'initialized randomly'; the checked checkpoint is
    loaded right after, so the log names that file instead."""
    import logging

    from dpmerge.models.spec import backbone_from_spec

    config, checkpoint = clip_files
    with caplog.at_level(logging.INFO):
        backbone_from_spec({"kind": "open_clip", "model": str(config), "checkpoint": str(checkpoint),
                            "pretrained": "", "trainable_blocks": 1})
    assert not [r for r in caplog.records if "initialized randomly" in r.getMessage()]
    printed = capsys.readouterr().out
    assert f"[backbone] open_clip: pretrained weights from {checkpoint}" in printed and "MiB" in printed


@pytest.mark.parametrize("trainable_blocks", ["all", 1])
def test_clip_top_computes_open_clips_normalised_image_embedding(clip_files, trainable_blocks):
    backbone = clip_backbone(clip_files, trainable_blocks=trainable_blocks)
    reference = open_clip.create_model(TINY_CLIP_NAME, pretrained=None)
    reference.load_state_dict(torch.load(clip_files[1], weights_only=True))
    reference.eval()
    images = uint8_images(6)
    (features,) = backbone.trunk_features(images, batch_size=4)
    assert features.dtype == (torch.uint8 if trainable_blocks == "all" else torch.float32)
    with torch.no_grad():
        ours = backbone.top(features)
        normalised = (images.float() / 255 - backbone._mean) / backbone._std
        theirs = torch.nn.functional.normalize(reference.encode_image(normalised), dim=-1)
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_clip_task_vectors_use_open_clip_names_and_round_trip(clip_files):
    backbone = clip_backbone(clip_files)
    state = backbone.top_state()
    reference = open_clip.create_model(TINY_CLIP_NAME, pretrained=None).state_dict()
    # Exactly the image tower's tensors, under the whole CLIP model's names and shapes.
    visual = {key: value for key, value in reference.items() if key.startswith("visual.")}
    assert set(state) == set(visual) == set(backbone.trainable_names())
    assert all(state[key].shape == visual[key].shape for key in state)
    shifted = {key: value + 0.01 * (i + 1) for i, (key, value) in enumerate(state.items())}
    backbone.load_top_state(shifted)
    back = backbone.top_state()
    assert all(torch.equal(back[key], shifted[key]) for key in state)


def test_clip_checkpoint_that_does_not_fit_is_refused_naming_the_key(clip_files, tmp_path):
    config, checkpoint = clip_files
    state = torch.load(checkpoint, weights_only=True)
    wrong_shape = dict(state, **{"visual.proj": torch.zeros(3, 3)})
    torch.save(wrong_shape, tmp_path / "shape.bin")
    with pytest.raises(ValueError, match=r"'visual\.proj' has shape \(3, 3\)"):
        load_backbone("open_clip", model=str(config), checkpoint=str(tmp_path / "shape.bin"), pretrained="")
    missing = {key: value for key, value in state.items() if key != "logit_scale"}
    torch.save(missing, tmp_path / "missing.bin")
    with pytest.raises(ValueError, match="lacks 'logit_scale'"):
        load_backbone("open_clip", model=str(config), checkpoint=str(tmp_path / "missing.bin"), pretrained="")
    torch.save(dict(state, extra=torch.zeros(1)), tmp_path / "extra.bin")
    with pytest.raises(ValueError, match="unexpected tensor 'extra'"):
        load_backbone("open_clip", model=str(config), checkpoint=str(tmp_path / "extra.bin"), pretrained="")


def test_clip_reads_ddp_wrapped_and_safetensors_checkpoints(clip_files, tmp_path):
    from safetensors.torch import save_file

    config, checkpoint = clip_files
    state = torch.load(checkpoint, weights_only=True)
    torch.save({"state_dict": {"module." + key: value for key, value in state.items()}}, tmp_path / "ddp.pt")
    save_file({key: value.contiguous() for key, value in state.items()}, tmp_path / "weights.safetensors")
    expected = clip_backbone(clip_files).top_state()
    for path in (tmp_path / "ddp.pt", tmp_path / "weights.safetensors"):
        got = load_backbone("open_clip", model=str(config), checkpoint=str(path), pretrained="").top_state()
        assert all(torch.equal(got[key], expected[key]) for key in expected)


def test_zeroshot_head_is_task_vectors_classifier(clip_files):
    backbone = clip_backbone(clip_files)
    templates = [lambda c: f"a photo of a {c}.", lambda c: f"a blurry photo of the {c}."]
    head = backbone.zeroshot_head(["cat", "dog", "truck"], templates)
    tokenizer = open_clip.get_tokenizer(TINY_CLIP_NAME)
    with torch.no_grad():
        rows = []
        for name in ["cat", "dog", "truck"]:
            embedded = backbone.clip.encode_text(tokenizer([t(name) for t in templates]))
            embedded = embedded / embedded.norm(dim=-1, keepdim=True)
            mean = embedded.mean(0)
            rows.append(mean / mean.norm())
        expected = torch.stack(rows) * backbone.clip.logit_scale.exp()
    assert torch.allclose(head["weight"], expected, atol=1e-6)
    assert torch.equal(head["bias"], torch.zeros(3))


@pytest.mark.slow
def test_clip_finetune_keeps_the_zero_shot_head_frozen(clip_files):
    backbone = clip_backbone(clip_files)
    head = backbone.zeroshot_head(["a", "b", "c"], [lambda c: f"a photo of a {c}."])
    (features,) = backbone.trunk_features(uint8_images(48))
    labels = torch.arange(48) % 3
    config = FinetuneConfig(method="dp_merging", target_epsilon=8.0, epochs=1, batch_size=16, lr=1e-3)
    result = train(backbone, 3, (features,), labels, config, **keyed(), log=lambda _: None, head=head,
                      train_head=False)
    assert all(torch.equal(result.head[k], head[k]) for k in head)
    assert set(result.task_vector) == set(backbone.trainable_names())
    assert any(v.abs().max() > 0 for v in result.task_vector.values())
    assert result.record["hyperparameters"]["train_head"] is False


def test_clip_gram_statistics_are_released_under_open_clip_names(clip_files):
    from dpmerge.privacy.statistics import gram_statistics

    backbone = clip_backbone(clip_files)
    (features,) = backbone.trunk_features(uint8_images(8))
    grams = gram_statistics(backbone, (features,))
    # q, k and v read one input, so their Grams are equal: one Gram for open_clip's packed in_proj
    block = "transformer.resblocks.0.attn"
    assert torch.equal(grams[f"{block}.q.weight"], grams[f"{block}.k.weight"])
    released = backbone.release_statistics("gram", grams)
    assert torch.equal(released[f"visual.{block}.in_proj_weight"], grams[f"{block}.q.weight"])
    assert set(released) <= set(backbone.trainable_names())
    assert "visual.proj" not in released  # transposed in open_clip: RegMean averages it


# ---------------------------------------------------------------------------------------------- RoBERTa


def test_roberta_top_is_transformers_first_token_state(roberta_dir):
    from transformers import RobertaModel

    backbone = load_backbone("roberta_base", checkpoint=str(roberta_dir), max_length=16)
    reference = RobertaModel.from_pretrained(roberta_dir, add_pooling_layer=False, hidden_dropout_prob=0.0,
                                             attention_probs_dropout_prob=0.0).eval()
    texts = [("the cat sat", "a dog ran"), ("rain fell", "birds sing in the morning")]
    features = backbone.trunk_features(texts)
    with torch.no_grad():
        ours = backbone.top(*features)
        ids, mask = backbone.encode_inputs(texts)
        theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
    assert (ours - theirs).abs().max().item() <= 1e-5
    assert backbone.trainable_names()[0].startswith("encoder.layer.0.")  # transformers' own names


def test_roberta_head_is_shaped_like_transformers_classification_head(roberta_dir):
    from transformers import RobertaConfig
    from transformers.models.roberta.modeling_roberta import RobertaClassificationHead

    backbone = load_backbone("roberta_base", checkpoint=str(roberta_dir))
    head = TaskModel(backbone, 3).head.state_dict()
    reference = RobertaClassificationHead(RobertaConfig.from_pretrained(roberta_dir, num_labels=3)).state_dict()
    assert {k: v.shape for k, v in head.items()} == {k: v.shape for k, v in reference.items()}
    assert backbone.head_outputs(head) == 3


def test_roberta_checkpoint_that_does_not_fit_is_refused(roberta_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(roberta_dir, broken)
    state = load_file(broken / "model.safetensors")
    key = next(k for k in state if "attention.self.query.weight" in k)
    state[key] = torch.zeros(5, 5)
    save_file(state, broken / "model.safetensors")
    with pytest.raises(ValueError, match="query.weight' has shape \\(5, 5\\)"):
        load_backbone("roberta_base", checkpoint=str(broken))
    (broken / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_backbone("roberta_base", checkpoint=str(broken))


@pytest.mark.slow
def test_regression_head_trains_privately_and_scores_by_spearman(roberta_dir):
    backbone = load_backbone("roberta_base", checkpoint=str(roberta_dir), max_length=16)
    texts = [(CORPUS[i % 4], CORPUS[(i + 1) % 4]) for i in range(40)]
    features = backbone.trunk_features(texts)
    labels = torch.tensor([float(i % 5) for i in range(40)])
    config = FinetuneConfig(method="naive_dp", target_epsilon=8.0, epochs=1, batch_size=8, lr=1e-3)
    result = train(backbone, 1, features, labels, config, **keyed(), log=lambda _: None)
    assert result.head["out_proj.weight"].shape == (1, backbone.embed_dim)
    model = TaskModel.with_head(backbone, result.head)
    with torch.no_grad():
        outputs = model(*features)
    assert outputs.shape == (40, 1)
    assert losses.task_loss(outputs, labels).item() == pytest.approx(
        torch.mean((outputs.squeeze(-1) - labels) ** 2).item())


def test_glue_metrics():
    labels = np.array([1, 0, 1, 1, 0, 0])
    predictions = np.array([1, 0, 0, 1, 1, 0])
    accuracy, f1 = 100 * 4 / 6, 100 * 2 * 2 / (2 * 2 + 1 + 1)
    assert score("f1_accuracy", predictions, labels) == pytest.approx((accuracy + f1) / 2)
    assert score("spearman", np.array([0.1, 0.4, 0.2, 0.9]), np.array([1.0, 3.0, 2.0, 5.0])) == pytest.approx(100)
    assert score("spearman", np.array([0.3, 0.3, 0.3]), np.array([1.0, 2.0, 3.0])) == 0.0


# ------------------------------------------------------------------------------------------ GPU readiness


def test_device_selection(clip_files):
    backbone = clip_backbone(clip_files)
    assert backbone.set_device("auto").device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            backbone.set_device("cuda")
    with pytest.raises(ValueError, match="precision must be one of"):
        backbone.set_device("cpu", precision="fp16")
    # bf16 autocast is a CUDA feature here: on the CPU the forward stays float32, bit for bit
    backbone.set_device("cpu", precision="bf16")
    assert not torch.is_autocast_enabled("cpu")
    with backbone.autocast():
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["bookkeeping", "functorch"])
def test_clipping_under_bf16_autocast_happens_in_float32(clip_files, strategy):
    """Under autocast the forward runs in bf16; per-example norms, clipping factors and sums stay float32, so
    each example's contribution is bounded by C (the sensitivity the accountant assumes)."""
    backbone = clip_backbone(clip_files, trainable_blocks=1)
    head = backbone.zeroshot_head(["a", "b"], [lambda c: f"a {c}"])
    model = TaskModel.with_head(backbone, head)
    model.head.requires_grad_(False)
    (features,) = backbone.trunk_features(uint8_images(6))
    labels = torch.tensor([0, 1, 0, 1, 0, 1])

    def bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    exact = make_clipper(model, strategy)
    reference = exact.clipped_sum((features,), labels, clip_norm=0.5)
    exact.close()
    low = make_clipper(model, strategy, autocast=bf16)
    sums = low.clipped_sum((features,), labels, clip_norm=0.5)
    for example in range(6):
        one = low.clipped_sum((features[example:example + 1],), labels[example:example + 1], clip_norm=0.5)
        assert torch.linalg.vector_norm(torch.cat([s.flatten() for s in one])).item() <= 0.5 * (1 + 1e-5)
    low.close()
    assert all(s.dtype == torch.float32 for s in sums)
    total = torch.cat([s.flatten() for s in sums])
    expected = torch.cat([s.flatten() for s in reference])
    assert (torch.linalg.vector_norm(total - expected) / torch.linalg.vector_norm(expected)).item() < 0.05


def test_unknown_backbone_lists_the_known_ones():
    with pytest.raises(ValueError, match="known backbones: .*clip_vit_b32.*roberta_large"):
        load_backbone("vit_huge")
    assert {"clip_vit_b32", "clip_vit_b16", "clip_vit_l14", "roberta_base", "roberta_large"} <= set(BACKBONES)
    assert BACKBONES["clip_vit_l14"].zeroshot_heads and not BACKBONES["roberta_large"].zeroshot_heads


@pytest.mark.slow
def test_prepare_names_a_missing_dataset_and_how_to_get_it(tmp_path):
    import subprocess
    import sys

    spec = json.dumps({"kind": "minilm_l6", "trainable_blocks": 1})
    result = subprocess.run([sys.executable, "-m", "dpmerge.cli", "prepare", "--backbone", "m", "--backbone-spec",
                             spec, "--task", "cola", "--data-dir", str(tmp_path), "--out", str(tmp_path / "x.pt")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "cola" in result.stderr and str(tmp_path / "glue") in result.stderr
    assert "dpmerge prepare-data --task cola" in result.stderr
    assert not (tmp_path / "x.pt").exists()
