"""The dpmerge command line: --help everywhere, merge on real files, clear errors on bad input."""

import re
import subprocess
import sys

import pytest
import torch

from dpmerge.artifacts import PRIVACY_FIELDS, load_tensors, save_released, save_tensors
from dpmerge.cli import build_parser, main

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dpmerge.cli", *args], capture_output=True, text=True)


def test_every_command_has_help(capsys):
    assert run_cli("--help").returncode == 0  # the real entry point once; each command's help in process
    for command in COMMANDS:
        with pytest.raises(SystemExit) as stop:
            main([command, "--help"])
        assert stop.value.code == 0, command
        assert "usage: dpmerge " + command in capsys.readouterr().out


@pytest.mark.parametrize("label,hparams,message", [
    ("dp_merging-rho0.1", '{"rho": 0.2}', "--method dp_merging-rho0.1 says rho = 0.1, but --hparams gives 0.2"),
    ("dp_merging-lambda0.5", "{}", "says anchor_lambda = 0.5, but --hparams gives no value"),
    ("dp_merging-sigma2", "{}", "expected <method>-<rho|lambda><value>"),
    ("dpsgd", "{}", "unknown method 'dpsgd'"),
])
def test_finetune_refuses_a_sweep_label_its_settings_contradict(tmp_path, label, hparams, message):
    result = run_cli("finetune", "--backbone", "x", "--backbone-spec", "{}", "--data", str(tmp_path / "none.pt"),
                     "--method", label, "--hparams", hparams, "--study-key", str(tmp_path / "key"),
                     "--out-vector", str(tmp_path / "v"),
                     "--out-head", str(tmp_path / "h"))
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_sweep_labels_round_trip():
    from dpmerge.training.methods import parse_label, sweep_label

    assert parse_label("naive_dp") == ("naive_dp", {})
    assert parse_label(sweep_label("dp_merging", "rho", 0.1)) == ("dp_merging", {"rho": 0.1})
    assert parse_label(sweep_label("dp_anchor", "anchor_lambda", 1e-5)) == ("dp_anchor", {"anchor_lambda": 1e-5})


def record(**overrides):
    base = {field: 0 for field in PRIVACY_FIELDS}
    base.update(method="naive_dp", target_epsilon=4.0, spent_epsilon=3.9, delta=1e-3, seed=0,
                pretrained_sha256="abc", accountant="rdp", sampling="poisson")
    base.update(overrides)
    return base


@pytest.fixture
def released(tmp_path):
    base = {"w": torch.tensor([1.0, 1.0, 1.0]), "b": torch.tensor([0.5])}
    save_tensors(tmp_path / "w0.safetensors", base, {"pretrained_sha256": "abc"})
    vectors = [{"w": torch.tensor([1.0, -2.0, 0.0]), "b": torch.tensor([1.0])},
               {"w": torch.tensor([3.0, 2.0, 1.0]), "b": torch.tensor([-1.0])}]
    paths = []
    for index, vector in enumerate(vectors):
        path = tmp_path / f"tv{index}.safetensors"
        save_released(path, vector, record(), {"backbone": "toy", "task": f"task{index}"})
        paths.append(str(path))
    return tmp_path, base, vectors, paths


def test_merge_command_writes_w0_plus_merged_vector_with_provenance(released):
    folder, base, vectors, paths = released
    out = folder / "merged.safetensors"
    main(["merge", "--method", "task_arithmetic", "--base", str(folder / "w0.safetensors"),
          "--param", "scaling=0.5", "-o", str(out), *paths])
    merged, meta = load_tensors(out)
    assert torch.allclose(merged["w"], base["w"] + 0.5 * (vectors[0]["w"] + vectors[1]["w"]))
    assert torch.allclose(merged["b"], base["b"])
    assert meta["operator"] == "task_arithmetic" and meta["hyperparameters"] == {"scaling": 0.5}
    assert meta["tasks"] == ["task0", "task1"] and len(meta["inputs"]) == 2
    assert meta["release_epsilon"] == 3.9
    assert meta["merge_name"] == "task_arithmetic" and meta["vectors"] == "task"


def test_merge_command_merges_difference_vectors_around_the_average(released):
    folder, base, vectors, paths = released
    out = folder / "merged.safetensors"
    main(["merge", "--method", "task_arithmetic", "--vectors", "difference", "--base", str(folder / "w0.safetensors"),
          "-o", str(out), *paths])
    merged, meta = load_tensors(out)
    average = {k: (vectors[0][k] + vectors[1][k]) / 2 for k in base}
    for key in base:  # sum_t d_t = 0, so task arithmetic of the differences is the weight average
        assert torch.allclose(merged[key], base[key] + average[key])
    assert meta["merge_name"] == "task_arithmetic_difference" and meta["vectors"] == "difference"


def test_merge_refuses_a_vector_without_privacy_record(released):
    folder, _, _, paths = released
    bare = folder / "bare.safetensors"
    save_tensors(bare, {"w": torch.zeros(3), "b": torch.zeros(1)}, {"task": "x"})
    with pytest.raises(SystemExit, match="privacy record lacks"):
        main(["merge", "--method", "weight_averaging", "--base", str(folder / "w0.safetensors"),
              "-o", str(folder / "m.safetensors"), paths[0], str(bare)])


def test_merge_names_unknown_operator_and_hyperparameter(released):
    folder, _, _, paths = released
    common = ["--base", str(folder / "w0.safetensors"), "-o", str(folder / "m.safetensors"), *paths]
    with pytest.raises(SystemExit, match="known operators"):
        main(["merge", "--method", "fishr", *common])
    with pytest.raises(SystemExit, match=r"fisher needs --statistics \(from 'dpmerge statistics --kind fisher'\)"):
        main(["merge", "--method", "fisher", *common])
    with pytest.raises(SystemExit, match="ties uses no data statistics; drop --statistics"):
        main(["merge", "--method", "ties", "--statistics", str(folder / "w0.safetensors"), *common])
    with pytest.raises(SystemExit, match="allowed: density, merge_func, scaling, topk_scope"):
        main(["merge", "--method", "ties", "--param", "lambda=1", *common])


@pytest.mark.parametrize(
    "vector,message",
    [
        ({"w": torch.tensor([1.0, float("inf"), 0.0]), "b": torch.tensor([1.0])}, "tensor 'w' contains NaN or Inf"),
        ({"w": torch.zeros(3)}, "lacks tensors that"),
        ({"w": torch.zeros(3), "b": torch.zeros(1), "c": torch.zeros(1)}, "has tensors that"),
        ({"w": torch.zeros(4), "b": torch.zeros(1)}, "tensor 'w' has shape (4,)"),
        ({"w": torch.zeros(3, dtype=torch.float64), "b": torch.zeros(1)}, "tensor 'w' has dtype"),
    ],
)
def test_bad_task_vector_is_named_and_no_output_is_left(released, vector, message):
    folder, _, _, paths = released
    bad = folder / "bad.safetensors"
    save_released(bad, vector, record(), {"backbone": "toy", "task": "bad"})
    out = folder / "m.safetensors"
    with pytest.raises(SystemExit, match=re.escape(message)) as error:
        main(["merge", "--method", "ties", "--base", str(folder / "w0.safetensors"), "-o", str(out), paths[0], str(bad)])
    assert str(bad) in str(error.value)
    assert not out.exists() and list(folder.glob("m.safetensors*")) == []


def test_vectors_from_other_pretrained_weights_are_refused(released):
    folder, _, _, paths = released
    foreign = folder / "foreign.safetensors"
    save_released(foreign, {"w": torch.zeros(3), "b": torch.zeros(1)}, record(pretrained_sha256="def"),
                  {"backbone": "toy", "task": "foreign"})
    with pytest.raises(SystemExit, match="pretrained_sha256"):
        main(["merge", "--method", "weight_averaging", "--base", str(folder / "w0.safetensors"),
              "-o", str(folder / "m.safetensors"), paths[0], str(foreign)])


def test_released_artifact_without_record_is_never_written(tmp_path):
    incomplete = record()
    del incomplete["spent_epsilon"]
    with pytest.raises(ValueError, match="spent_epsilon"):
        save_released(tmp_path / "tv.safetensors", {"w": torch.zeros(1)}, incomplete)
    assert not (tmp_path / "tv.safetensors").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left behind either
