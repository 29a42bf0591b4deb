"""Denoising released task vectors (merge/denoise.py, merge/noise_floor.py) on synthetic matrices whose signal and
noise level are known: the noise level estimated within 10 %, the signal recovered closer than the noisy input,
pure noise taken to (near) zero."""

import math

import pytest
import torch
from scipy import integrate

from dpmerge.merge.denoise import (
    DENOISERS,
    MIN_SPECTRUM,
    denoise_matrix,
    denoise_vector,
    james_stein,
    pooled_noise_level,
)
from dpmerge.merge.noise_floor import marchenko_pastur_median, noise_level, optimal_hard_threshold


def low_rank(rows, cols, rank, strength, seed):
    """A rank-`rank` matrix whose singular values are `strength` times the noise bulk's edge at sigma = 1."""
    generator = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, rank, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, rank, generator=generator, dtype=torch.float64))
    edge = math.sqrt(max(rows, cols)) * (1 + math.sqrt(min(rows, cols) / max(rows, cols)))
    values = strength * edge * torch.linspace(1.0, 2.0, rank, dtype=torch.float64)
    return (u * values) @ v.T


def noise(rows, cols, sigma, seed):
    generator = torch.Generator().manual_seed(seed + 1000)
    return sigma * torch.randn(rows, cols, generator=generator, dtype=torch.float64)


def test_the_marchenko_pastur_median_matches_its_definition_and_known_values():
    # Gavish and Donoho, Table II / their code: mu_1 = 0.6528; the median of the square case by definition
    assert marchenko_pastur_median(1.0) == pytest.approx(0.6528, abs=1e-4)
    for beta in (0.05, 0.3, 0.7):
        low, high = (1 - math.sqrt(beta)) ** 2, (1 + math.sqrt(beta)) ** 2
        mass = integrate.quad(lambda x: math.sqrt((high - x) * (x - low)) / (2 * math.pi * beta * x), low,
                              marchenko_pastur_median(beta))[0]
        assert mass == pytest.approx(0.5, abs=1e-8)
    assert optimal_hard_threshold(1.0) == pytest.approx(4 / math.sqrt(3))
    with pytest.raises(ValueError, match="beta"):
        marchenko_pastur_median(1.5)


@pytest.mark.parametrize("shape", [(200, 400), (300, 300), (500, 120), (64, 1152)])
@pytest.mark.parametrize("sigma", [0.01, 2.0])
def test_the_noise_level_is_estimated_within_ten_percent_under_a_low_rank_signal(shape, sigma):
    signal = sigma * low_rank(*shape, rank=5, strength=3.0, seed=1)
    noisy = signal + noise(*shape, sigma, seed=1)
    estimate = noise_level(torch.linalg.svdvals(noisy), noisy.shape)
    assert estimate == pytest.approx(sigma, rel=0.10)


@pytest.mark.parametrize("method", ["svd_shrink", "svd_hard"])
@pytest.mark.parametrize("shape", [(200, 400), (500, 120)])
def test_the_recovered_signal_is_closer_than_the_noisy_input(method, shape):
    sigma = 0.05
    signal = sigma * low_rank(*shape, rank=6, strength=2.5, seed=2)
    noisy = signal + noise(*shape, sigma, seed=2)
    denoised, summary = denoise_vector({"layer.weight": noisy.float()}, method)
    reading = summary["tensors"]["layer.weight"]
    recovered = denoised["layer.weight"].double()
    assert denoised["layer.weight"].dtype == torch.float32  # the release's dtype kept
    assert (recovered - signal).norm() < 0.5 * (noisy - signal).norm()
    assert reading["kept_rank"] == 6  # every signal direction above the floor, no noise direction
    assert reading["noise_level"] == pytest.approx(sigma, rel=0.10)
    assert 0 < reading["kept_energy"] < 1


@pytest.mark.parametrize("method", list(DENOISERS))
@pytest.mark.parametrize("shape", [(256, 256), (100, 800), (9, 1152)])
def test_pure_noise_is_taken_to_near_zero(method, shape):
    noisy = noise(*shape, 0.3, seed=3)
    denoised, summary = denoise_vector({"w": noisy}, method)
    assert denoised["w"].norm() < 0.05 * noisy.norm()
    if method != "james_stein":
        assert summary["tensors"]["w"]["how"] == "spectral"


def test_hard_thresholding_drops_pure_noise_exactly_and_shrinkage_nearly():
    noisy = noise(300, 600, 1.0, seed=4)
    hard, hard_reading = denoise_matrix(noisy, "hard")
    shrunk, shrink_reading = denoise_matrix(noisy, "shrink")
    assert hard_reading.kept_rank == 0 and float(hard.abs().max()) == 0.0
    assert shrink_reading.kept_energy < 1e-3


def test_a_conv_weight_is_denoised_through_its_unfolded_matrix_and_keeps_its_shape():
    sigma = 0.02
    signal = sigma * low_rank(64, 32 * 9, rank=3, strength=3.0, seed=5)
    noisy = (signal + noise(64, 32 * 9, sigma, seed=5)).reshape(64, 32, 3, 3)
    denoised, summary = denoise_vector({"conv.weight": noisy}, "svd_shrink")
    assert denoised["conv.weight"].shape == noisy.shape
    assert summary["tensors"]["conv.weight"]["kept_rank"] == 3
    assert (denoised["conv.weight"].reshape(64, -1) - signal).norm() < (noisy.reshape(64, -1) - signal).norm()


def test_vectors_and_thin_matrices_take_the_pooled_level_of_the_release():
    sigma = 0.1
    matrices = {f"layer{i}.weight": noise(128, 256, sigma, seed=10 + i) for i in range(3)}
    bias_noise = noise(1, 512, sigma, seed=20).flatten()
    bias_signal = torch.zeros(512, dtype=torch.float64)
    bias_signal[:8] = 2.0  # a few large entries: James-Stein keeps most of them
    thin = noise(4, 300, sigma, seed=21)  # 4 singular values: too few for a median, shrunk as a vector
    tensors = {**matrices, "layer.bias": bias_signal + bias_noise, "token": thin}
    denoised, summary = denoise_vector(tensors, "svd_shrink")
    assert list(denoised) == list(tensors)
    assert summary["pooled_noise_level"] == pytest.approx(sigma, rel=0.10)
    assert summary["pooled_from"] == "median of the matrices' estimates"
    bias = summary["tensors"]["layer.bias"]
    assert bias["how"] == "james_stein" and bias["noise_level"] == summary["pooled_noise_level"]
    assert (denoised["layer.bias"] - bias_signal).norm() < bias_noise.norm()
    assert summary["tensors"]["token"]["how"] == "james_stein"
    assert min(thin.shape) < MIN_SPECTRUM
    assert denoised["token"].norm() < 0.2 * thin.norm()  # pure noise shrunk hard


@pytest.mark.parametrize("method", ["svd_shrink", "james_stein"])
def test_frozen_zero_matrices_leave_the_pooled_level_to_the_others(method):
    sigma = 0.1
    tensors = {f"frozen{i}.weight": torch.zeros(64, 64, dtype=torch.float64) for i in range(3)}
    tensors["trained.weight"] = noise(128, 256, sigma, seed=40)
    tensors["trained.bias"] = noise(1, 128, sigma, seed=41).flatten()
    denoised, summary = denoise_vector(tensors, method)
    assert summary["pooled_noise_level"] == pytest.approx(sigma, rel=0.10)
    assert all(float(denoised[f"frozen{i}.weight"].abs().max()) == 0 for i in range(3))


def test_without_any_matrix_the_level_comes_from_the_median_absolute_deviation():
    values = noise(1, 4000, 0.5, seed=30).flatten()
    values[:20] += 10.0  # a sparse signal leaves the MAD where the noise puts it
    sigma, source = pooled_noise_level([], {"bias": values})
    assert source == "median absolute deviation"
    assert sigma == pytest.approx(0.5, rel=0.10)


def test_james_stein_leaves_tiny_tensors_and_zero_alone():
    scalar = torch.tensor([0.3, -0.2])
    kept, reading = james_stein(scalar, 1.0)
    assert torch.equal(kept, scalar) and reading.kept_energy == 1.0
    zero, reading = james_stein(torch.zeros(10), 1.0)
    assert torch.equal(zero, torch.zeros(10)) and math.isnan(reading.kept_energy)
    _, summary = denoise_vector({"zero": torch.zeros(10)}, "svd_shrink")
    assert summary["tensors"]["zero"]["kept_energy"] is None  # metadata is JSON: no NaN in it


def test_an_unknown_method_is_named():
    with pytest.raises(ValueError, match="svd_shrink"):
        denoise_vector({"w": torch.zeros(3, 3)}, "wiener")


def _released_vector(tmp_path, task, seed=0, **overrides):
    """A release file (a noisy task vector with its record, as finetune() writes it)."""
    from dpmerge.artifacts import save_released
    from privacy_records import release

    name, record = release(task, seed=seed, **overrides)
    tensors = {"layer.weight": noise(64, 96, 0.01, seed=seed + ord(task[0])).float(),
               "layer.bias": noise(1, 64, 0.01, seed=seed + 7).flatten().float()}
    path = tmp_path / name
    save_released(path, tensors, {**record, "artifact": "task_vector"})
    return str(path)


@pytest.mark.slow
def test_the_ledger_accepts_a_denoised_release_at_no_new_budget(tmp_path):
    from dpmerge.artifacts import read_metadata
    from dpmerge.privacy.ledger import build_ledger, check_ledger, ledger_check, ledger_report, task_composition
    from dpmerge.stages.denoise import denoise

    releases = [_released_vector(tmp_path, task) for task in ("a", "b")]
    denoised = []
    for path in releases:
        out = path.replace(".safetensors", "_denoised.safetensors")
        denoise(task_vector=path, method="svd_shrink", out=out)
        denoised.append(out)
    meta, parent = read_metadata(denoised[0]), read_metadata(releases[0])
    assert meta["spent_epsilon"] == parent["spent_epsilon"] and meta["post_processing_of"]["method"] == "svd_shrink"
    assert meta["denoised"]["tensors"]["layer.weight"]["how"] == "spectral"

    alone, both = build_ledger(releases), build_ledger(releases + denoised)
    assert check_ledger(both) == []
    verdict = ledger_check(both, [])
    assert (verdict["releases"], verdict["private_releases"], verdict["post_processed"]) == (2, 2, 2)
    composed_alone = task_composition(alone).set_index("task")["composed_epsilon"]
    composed_both = task_composition(both).set_index("task")
    assert list(composed_both["composed_epsilon"]) == list(composed_alone)  # nothing composed for post-processing
    assert list(composed_both["private_releases"]) == [1, 1] and list(composed_both["post_processed"]) == [1, 1]
    assert "| denoise | b | dp_merging | 4.0 | 2 | 2 of 2 |" in ledger_report(both, [])


@pytest.mark.slow
def test_the_ledger_refuses_a_denoised_release_without_its_release_or_with_another_record(tmp_path):
    from dpmerge.artifacts import load_tensors, save_tensors
    from dpmerge.privacy.ledger import build_ledger, check_ledger
    from dpmerge.stages.denoise import denoise

    release_a, release_b = _released_vector(tmp_path, "a"), _released_vector(tmp_path, "b")
    out = str(tmp_path / "a_denoised.safetensors")
    denoise(task_vector=release_a, method="svd_hard", out=out)
    orphan = check_ledger(build_ledger([release_b, out]))
    assert len(orphan) == 1 and "of a release the ledger does not hold" in orphan[0]
    tensors, meta = load_tensors(out)
    lighter = str(tmp_path / "a_denoised_claims_less.safetensors")
    save_tensors(lighter, tensors, {**meta, "spent_epsilon": 1.0, "target_epsilon": 1.0})
    problems = check_ledger(build_ledger([release_a, lighter]))
    assert any("record differs from its release's in spent_epsilon, target_epsilon" in p for p in problems)


@pytest.mark.slow
def test_denoise_refuses_heads_and_denoising_twice_and_keeps_plain_vectors_plain(tmp_path):
    from dpmerge.artifacts import read_metadata, save_released, save_tensors
    from dpmerge.stages.denoise import denoise
    from privacy_records import release

    _, record = release("a")
    head = tmp_path / "head.safetensors"
    save_released(head, {"weight": torch.zeros(3, 4)}, {**record, "artifact": "head"})
    with pytest.raises(ValueError, match="is a head, not a task vector"):
        denoise(task_vector=str(head), method="svd_shrink", out=str(tmp_path / "x.safetensors"))
    once = str(tmp_path / "once.safetensors")
    denoise(task_vector=_released_vector(tmp_path, "a"), method="svd_shrink", out=once)
    with pytest.raises(ValueError, match="already a post-processing"):
        denoise(task_vector=once, method="svd_shrink", out=str(tmp_path / "twice.safetensors"))
    plain = tmp_path / "plain.safetensors"
    save_tensors(plain, {"w": noise(32, 40, 1.0, seed=9).float()})
    denoise(task_vector=str(plain), method="svd_shrink", out=str(tmp_path / "plain_out.safetensors"))
    meta = read_metadata(tmp_path / "plain_out.safetensors")
    assert "spent_epsilon" not in meta and meta["post_processing_of"]["operation"] == "denoise"
