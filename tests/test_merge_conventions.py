"""Where our operators depart from their reference code, the `reference` settings reproduce it: each is checked
against a transcription of that code (tests/reference_merges.py) on the inputs where the conventions differ,
and our default is shown to differ there, so a setting that were ignored would fail."""

from pathlib import Path

import pytest
import torch
import yaml

from dpmerge.artifacts import save_tensors
from dpmerge.config_check import ConfigError, check_config
from dpmerge.merge.checks import check_hyperparameters
from dpmerge.merge.registry import PERSONAL, fisher, merge, merge_stream, personal_vector, ties, tsv_m
from dpmerge.merge.sources import SafetensorsSource, StatisticsSource
from reference_merges import emr_reference, fisher_reference, ties_reference, tsvm_reference

ROOT = Path(__file__).resolve().parents[1]
TIES_REFERENCE = {"trim": "reference", "zero_sign": "majority"}
EMR_REFERENCE = {"rescale": "per_tensor", "zero_sign": "negative"}


def integer_vectors(count=4, seed=0):
    """Small integers: many equal magnitudes (ties at every threshold), zeros, and entries that cancel."""
    generator = torch.Generator().manual_seed(seed)
    shapes = {"a.weight": (6, 5), "b.bias": (7,), "c.weight": (3, 4)}
    return [{k: torch.randint(-3, 4, s, generator=generator).float() for k, s in shapes.items()}
            for _ in range(count)]


def random_vectors(count=3, seed=0, dtype=torch.float64):
    """Tensors of different sizes and scales, so that per-tensor means and whole-vector sums disagree."""
    generator = torch.Generator().manual_seed(seed)
    shapes = {"big.weight": ((20, 10), 1.0), "small.bias": ((3,), 5.0), "mid.weight": ((5, 4), 0.2)}
    return [{k: (scale * torch.randn(s, generator=generator)).to(dtype) for k, (s, scale) in shapes.items()}
            for _ in range(count)]


# ---- TIES


def test_integer_vectors_hold_the_cases_where_the_conventions_differ():
    """The TIES inputs below really have cancelling entries (an elected sign of 0 with values to keep)."""
    stacked = torch.stack([torch.cat([v.reshape(-1) for v in tv.values()]) for tv in integer_vectors()])
    cancelling = (stacked.sum(0) == 0) & (stacked != 0).any(0)
    assert cancelling.sum() >= 3


@pytest.mark.parametrize("density", [0.0, 0.1, 0.2, 0.35, 0.5, 0.9])
@pytest.mark.parametrize("merge_func", ["mean", "sum"])
def test_ties_reference_settings_are_the_ties_code_exactly(density, merge_func):
    vectors = integer_vectors()
    ours = ties(vectors, density=density, scaling=0.3, merge_func=merge_func, **TIES_REFERENCE)
    expected = ties_reference(vectors, density, 0.3, merge_func)
    for key in expected:
        assert torch.equal(ours[key], expected[key]), key


@pytest.mark.parametrize("density", [0.05, 0.2, 0.7])
def test_ties_reference_settings_match_the_ties_code_on_random_vectors(density):
    """Distinct magnitudes; float32, as task vectors are (the streamed threshold is a float32 order statistic)."""
    vectors = random_vectors(4, seed=3, dtype=torch.float32)
    ours = ties(vectors, density=density, merge_func="mean", **TIES_REFERENCE)
    expected = ties_reference(vectors, density, 1.0, "mean")
    for key in expected:
        torch.testing.assert_close(ours[key], expected[key], rtol=1e-6, atol=1e-7)


def test_ties_round_keeps_round_dk_where_the_reference_keeps_int_dk_plus_one():
    vector = {"w": torch.randn(100, generator=torch.Generator().manual_seed(1))}
    assert int((ties([vector], density=0.2)["w"] != 0).sum()) == 20
    assert int((ties([vector], density=0.2, trim="reference")["w"] != 0).sum()) == 21
    assert int((ties_reference([vector], 0.2, 1.0, "mean")["w"] != 0).sum()) == 21
    # at density 0 ours keeps nothing, the reference its largest entry
    assert int((ties([vector], density=0.0)["w"] != 0).sum()) == 0
    assert int((ties([vector], density=0.0, trim="reference")["w"] != 0).sum()) == 1


def test_ties_cancelling_entries_take_the_majority_sign_or_the_negatives():
    # entry 0 cancels; the other entries elect +, so the majority is + and entry 0 keeps its positive value
    vectors = [{"w": torch.tensor([1.0, 5.0, 2.0])}, {"w": torch.tensor([-1.0, 0.0, 0.0])}]
    assert torch.equal(ties(vectors, density=0.9)["w"], torch.tensor([0.0, 5.0, 2.0]))
    assert torch.equal(ties(vectors, density=0.9, **TIES_REFERENCE)["w"], torch.tensor([1.0, 5.0, 2.0]))
    # every entry cancels: the majority sign is 0 too, and the code's where(sign > 0, v > 0, v < 0) keeps v < 0
    vectors = [{"w": torch.tensor([1.0, 3.0])}, {"w": torch.tensor([-1.0, -3.0])}]
    assert torch.equal(ties(vectors, density=0.5)["w"], torch.zeros(2))
    assert torch.equal(ties(vectors, density=0.5, **TIES_REFERENCE)["w"], torch.tensor([-1.0, -3.0]))
    assert torch.equal(ties_reference(vectors, 0.5, 1.0, "mean")["w"], torch.tensor([-1.0, -3.0]))


def test_ties_defaults_differ_from_the_ties_code_where_documented():
    vectors = integer_vectors()
    ours = ties(vectors, density=0.2)
    expected = ties_reference(vectors, 0.2, 1.0, "mean")
    assert any(not torch.equal(ours[key], expected[key]) for key in expected)
    # each setting alone falls short where the other convention matters: cancelling entries (zero_sign) ...
    partly = ties(vectors, density=0.9, trim="reference")
    expected = ties_reference(vectors, 0.9, 1.0, "mean")
    assert any(not torch.equal(partly[key], expected[key]) for key in expected)
    # ... and distinct magnitudes with density * K = 22.3 (trim: 22 kept against 23)
    vectors = random_vectors(4, seed=3, dtype=torch.float32)
    partly = ties(vectors, density=0.1, zero_sign="majority")
    expected = ties_reference(vectors, 0.1, 1.0, "mean")
    assert any(not torch.allclose(partly[key], expected[key]) for key in expected)


# ---- EMR


def cancelling(vectors):
    """An entry whose task values sum to exactly 0 with some of them non-zero."""
    vectors = [{k: v.clone() for k, v in tv.items()} for tv in vectors]
    for tv, value in zip(vectors, (2.0, -1.5, -0.5)):
        tv["mid.weight"][0, 0] = value
    return vectors


def emr_parts(merged, task, key):
    return merged[f"{PERSONAL}/{task}/mask/{key}"], merged[f"{PERSONAL}/{task}/scale/{key}"]


def test_emr_reference_settings_are_the_emr_code():
    vectors = cancelling(random_vectors())
    ours = merge("emr", vectors, **EMR_REFERENCE)
    unified, masks, rescalers = emr_reference(vectors)
    for key in unified:
        assert torch.equal(ours[key], unified[key]), key
        for task in range(len(vectors)):
            mask, scale = emr_parts(ours, task, key)
            assert torch.equal(mask.bool(), masks[key][task]), (key, task)
            # the code accumulates its rescalers in float32; ours are float64
            assert float(scale) == pytest.approx(float(rescalers[task]), rel=1e-6), (key, task)
    shared = {key: ours[key] for key in unified}
    for task in range(len(vectors)):
        rebuilt = personal_vector("emr", shared, ours, task, **EMR_REFERENCE)
        for key in unified:
            torch.testing.assert_close(rebuilt[key], rescalers[task].double() * masks[key][task] * unified[key],
                                       rtol=1e-6, atol=0)


def test_emr_defaults_differ_from_the_emr_code_where_documented():
    vectors = cancelling(random_vectors())
    unified, _, rescalers = emr_reference(vectors)
    ours = merge("emr", vectors)
    scales = torch.tensor([float(emr_parts(ours, task, "big.weight")[1]) for task in range(len(vectors))])
    assert ((scales / rescalers.double() - 1).abs() > 1e-3).all()  # whole-vector vs per-tensor means
    assert float(ours["mid.weight"][0, 0]) == 0.0 and float(unified["mid.weight"][0, 0]) == -1.5
    # each setting alone changes only its own part
    rescaled = merge("emr", vectors, rescale="per_tensor")
    assert float(emr_parts(rescaled, 0, "big.weight")[1]) == pytest.approx(float(rescalers[0]), rel=1e-6)
    assert float(rescaled["mid.weight"][0, 0]) == 0.0
    signed = merge("emr", vectors, zero_sign="negative")
    assert float(signed["mid.weight"][0, 0]) == -1.5


# ---- Fisher


def fisher_inputs(count=3, seed=2):
    """Fine-tuned parameters w0 + tau_t and Fishers with zeros: task 0's Fisher is 0 everywhere, task 1's on a
    whole tensor, and every task's on one entry."""
    vectors = random_vectors(count, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    base = {k: torch.randn(v.shape, generator=generator, dtype=torch.float64) for k, v in vectors[0].items()}
    fishers = [{k: torch.rand(v.shape, generator=generator, dtype=torch.float64) for k, v in tv.items()}
               for tv in vectors]
    fishers[0] = {k: torch.zeros_like(v) for k, v in fishers[0].items()}
    fishers[1]["small.bias"].zero_()
    for f in fishers:
        f["big.weight"][0, 0] = 0.0
    params = [{k: base[k] + tv[k] for k in base} for tv in vectors]
    return base, vectors, fishers, params


@pytest.mark.parametrize("minimal", [1e-6, 0.1])
def test_fisher_reference_normalization_is_fusion_bench(minimal):
    base, vectors, fishers, params = fisher_inputs()
    ours = fisher(vectors, fishers, normalization="reference", minimal_fisher_weight=minimal)
    expected = fisher_reference(params, fishers, True, minimal)
    for key in expected:
        torch.testing.assert_close(base[key] + ours[key], expected[key], rtol=1e-12, atol=1e-12)


def test_fisher_without_normalising_both_conventions_are_fusion_bench():
    base, vectors, fishers, params = fisher_inputs()
    expected = fisher_reference(params, fishers, False, 1e-6)
    for normalization in ("ours", "reference"):
        ours = fisher(vectors, fishers, normalize_fisher_weight=False, normalization=normalization)
        for key in expected:
            torch.testing.assert_close(base[key] + ours[key], expected[key], rtol=1e-12, atol=1e-12)


def test_fisher_default_normalization_differs_from_fusion_bench():
    base, vectors, fishers, params = fisher_inputs()
    ours = fisher(vectors, fishers)
    expected = fisher_reference(params, fishers, True, 1e-6)
    # the reference weighs task 0's all-zero Fisher m / m = 1 everywhere, more than any other task's normalised
    # entry (F / ||F|| < 1), where ours gives it m: the reference's merge lies much nearer task 0's parameters
    for key in expected:
        ours_distance = (base[key] + ours[key] - params[0][key]).norm()
        assert (expected[key] - params[0][key]).norm() < 0.5 * ours_distance, key


# ---- TSV-M


def tsvm_vectors(count=4, seed=4):
    generator = torch.Generator().manual_seed(seed)
    shapes = {"a.weight": (8, 6), "short.weight": (3, 5), "bias": (8,), "conv.weight": (4, 3, 2, 2)}
    return [{k: torch.randn(s, generator=generator) for k, s in shapes.items()} for _ in range(count)]


def test_tsvm_zero_short_matrices_is_the_tsv_code():
    """short.weight has 3 singular directions for 4 tasks; the reference recombines it to exactly 0. float32
    inputs (ours computes in float32) and the reference's other order of products: float32 tolerance."""
    vectors = tsvm_vectors()
    ours = tsv_m(vectors, include_conv=False, short_matrices="zero", scaling=0.8)
    expected = tsvm_reference(vectors, alpha=0.8)
    assert torch.equal(expected["short.weight"], torch.zeros(3, 5))
    assert torch.equal(ours["short.weight"], expected["short.weight"])
    for key in expected:
        torch.testing.assert_close(ours[key], expected[key], rtol=1e-4, atol=1e-5)


def test_tsvm_default_averages_short_matrices_where_the_code_gives_zero():
    vectors = tsvm_vectors()
    ours = tsv_m(vectors, include_conv=False)
    mean = torch.stack([v["short.weight"] for v in vectors]).mean(0)
    assert torch.equal(ours["short.weight"], mean) and mean.abs().max() > 0.1
    torch.testing.assert_close(ours["a.weight"], tsvm_reference(vectors)["a.weight"], rtol=1e-4, atol=1e-5)


# ---- every setting streams, is checked, and is reachable from a config and the command line


@pytest.mark.parametrize("name,hyper", [
    ("ties", TIES_REFERENCE), ("ties", {**TIES_REFERENCE, "topk_scope": "per_tensor"}), ("emr", EMR_REFERENCE),
    ("fisher", {"normalization": "reference"}), ("tsv_m", {"short_matrices": "zero"}),
])
def test_reference_settings_stream_bit_identically(tmp_path, name, hyper):
    vectors = [{k: v.float() for k, v in tv.items()} for tv in cancelling(random_vectors(4))]
    statistics = [{k: torch.rand(v.shape) for k, v in tv.items()} for tv in vectors] if name == "fisher" else None
    paths = []
    for index, vector in enumerate(vectors):
        paths.append(tmp_path / f"tv{index}.safetensors")
        save_tensors(paths[-1], vector, {"task": str(index)})
    source = SafetensorsSource(paths, StatisticsSource(statistics) if statistics else None)
    streamed = dict(merge_stream(name, source, **hyper))
    in_memory = merge(name, vectors, "task", statistics, **hyper)
    assert streamed.keys() == in_memory.keys()
    assert all(torch.equal(streamed[key], in_memory[key]) for key in in_memory)


@pytest.mark.slow
@pytest.mark.parametrize("operator,hyper,message", [
    ("ties", {"trim": "nearest"}, "ties trim must be 'round' or 'reference', got 'nearest'"),
    ("ties", {"zero_sign": "minority"}, "ties zero_sign must be 'none' or 'majority', got 'minority'"),
    ("ties", {"trim": "reference", "density": 1.0}, "ties density must be < 1 with trim 'reference'"),
    ("emr", {"rescale": "global"}, "emr rescale must be 'whole_vector' or 'per_tensor', got 'global'"),
    ("emr", {"zero_sign": "majority"}, "emr zero_sign must be 'none' or 'negative', got 'majority'"),
    ("fisher", {"normalization": "fusion_bench"}, "fisher normalization must be 'ours' or 'reference'"),
    ("tsv_m", {"short_matrices": "drop"}, "tsv_m short_matrices must be 'average' or 'zero', got 'drop'"),
    ("tsv_m", {"short_matrices": True}, "hyperparameter 'short_matrices' must be a word (default 'average')"),
])
def test_bad_convention_values_are_one_line_errors_naming_the_field(operator, hyper, message):
    with pytest.raises(ValueError) as refused:
        check_hyperparameters(operator, hyper)
    assert message in str(refused.value) and len(str(refused.value).splitlines()) == 1
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["merge"][f"{operator}_checked"] = {"operator": operator, **hyper}
    if operator == "fisher":
        config["merge"][f"{operator}_checked"]["statistics"] = {"data": "private", "clip_norm": 1.0, "epsilon": 1.0}
    with pytest.raises(ConfigError) as refused:
        check_config(config)
    assert f"merge.{operator}_checked: " in str(refused.value) and message in str(refused.value)


def test_reference_settings_pass_the_config_check():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["merge"].update(ties_code={"operator": "ties", **TIES_REFERENCE},
                           tsv_code={"operator": "tsv_m", "short_matrices": "zero"})
    check_config(config)


def test_the_command_line_takes_a_convention_as_a_param(tmp_path):
    """`dpmerge merge --param trim=reference` on plain task-vector files: the merged model is w0 + the code's."""
    from dpmerge.artifacts import load_tensors
    from dpmerge.cli import main

    vectors = integer_vectors(3)
    base = {k: torch.full_like(v, 0.5) for k, v in vectors[0].items()}
    save_tensors(tmp_path / "w0.safetensors", base)
    paths = []
    for index, vector in enumerate(vectors):
        paths.append(str(tmp_path / f"tv{index}.safetensors"))
        save_tensors(paths[-1], vector)
    out = tmp_path / "m.safetensors"
    main(["merge", "--method", "ties", "--param", "trim=reference", "--param", "zero_sign=majority",
          "--param", "density=0.5", "--base", str(tmp_path / "w0.safetensors"), "-o", str(out), *paths])
    merged, meta = load_tensors(out)
    assert meta["hyperparameters"]["trim"] == "reference"
    expected = ties_reference(vectors, 0.5, 1.0, "mean")
    assert all(torch.equal(merged[key], base[key] + expected[key]) for key in expected)
