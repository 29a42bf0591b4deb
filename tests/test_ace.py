"""ACE-Merging (merge/covariance.py) against a transcription of its official code (tests/reference_merges.py
ace_reference: unravel-xu/ACE-Merging src/merge/strategy.py, MergeStrategy.ace_merging), stage by stage, and the
properties its mathematics implies."""

import math
import warnings

import pytest
import torch

from dpmerge.merge.checks import check_hyperparameters
from dpmerge.merge.covariance import _solve_right, ace_layer, heterogeneity, noise_floor_share
from dpmerge.merge.registry import merge
from reference_merges import ace_reference


def updates(count, shape, seed, spread=1.0, scale=1.0):
    """Task vectors for one matrix and one bias, task t scaled by scale * spread**t: spread 1 gives a homogeneous
    layer (gamma near 0), a large spread a heterogeneous one."""
    generator = torch.Generator().manual_seed(seed)
    return [{"layer.weight": scale * spread**t * torch.randn(*shape, generator=generator, dtype=torch.float64),
             "layer.bias": torch.randn(shape[0], generator=generator, dtype=torch.float64)}
            for t in range(count)]


def ours(vectors, stage, **hyper):
    return merge("ace", vectors, stage=stage, include_conv=False, **hyper)


def official(vectors, stage):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.var of one task warns (degrees of freedom); it is NaN there
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # its zeros and eye in float64, to compare to the last digits
        try:
            return ace_reference(vectors, normalise=stage >= 2, use_prior=stage >= 3, refine=stage >= 4)
        finally:
            torch.set_default_dtype(previous)


CASES = [(count, shape, spread, scale)
         for count in (1, 2, 3, 5)
         for shape in ((6, 5), (5, 9), (12, 12), (30, 8))
         for spread, scale in ((1.0, 0.01), (1.0, 1.0), (8.0, 0.05))]


@pytest.mark.parametrize("stage", [1, 2, 3, 4])
def test_every_stage_is_the_official_code_with_that_stage_switched_on(stage):
    gates = set()
    for i, (count, shape, spread, scale) in enumerate(CASES):
        vectors = updates(count, shape, seed=i, spread=spread, scale=scale)
        expected = official(vectors, stage)
        merged = ours(vectors, stage)
        gates.add(ace_layer([v["layer.weight"] for v in vectors], eps=1e-2, gamma_threshold=0.3, k_fraction=0.3,
                            stage=stage, prior="official").heterogeneous)
        for key in expected:
            torch.testing.assert_close(merged[key], expected[key], rtol=1e-9, atol=1e-12,
                                       msg=f"{(count, shape, spread, scale)} {key}")
    assert gates == {True, False}  # both sides of the gate were compared


def test_float32_inputs_agree_with_the_official_float32_computation_and_are_nearer_the_exact_one():
    """Same inputs in float32: ours (solved in float64, rounded once) and the official code (float32 throughout)
    agree to float32 rounding, and ours is the nearer to the exact (float64) merge."""
    exact_inputs = updates(4, (40, 24), seed=7, spread=6.0, scale=0.1)
    vectors = [{k: v.float() for k, v in tv.items()} for tv in exact_inputs]
    exact = official(exact_inputs, 4)["layer.weight"]
    merged = merge("ace", vectors)["layer.weight"]
    theirs = ace_reference(vectors)["layer.weight"]
    assert merged.dtype == theirs.dtype == torch.float32
    assert (merged.double() - theirs.double()).norm() / exact.norm() < 1e-5
    assert (merged.double() - exact).norm() < (theirs.double() - exact).norm()


def test_e1_with_equal_covariances_is_the_mean_of_the_centred_updates():
    """Row permutations keep each update's centred covariance, so A = T R and W0 = mean of the centred dW_t."""
    generator = torch.Generator().manual_seed(3)
    base = torch.randn(7, 4, generator=generator, dtype=torch.float64)
    vectors = [{"w": base[torch.randperm(7, generator=generator)]} for _ in range(4)]
    centred = [v["w"] - v["w"].mean(0, keepdim=True) for v in vectors]
    torch.testing.assert_close(ours(vectors, 1)["w"], sum(centred) / 4)


def test_identical_updates_are_homogeneous_and_e1_returns_the_centred_update():
    w = updates(1, (9, 6), seed=4)[0]["layer.weight"]
    assert heterogeneity([float(w.pow(2).sum())] * 3) == 0
    torch.testing.assert_close(ours([{"w": w}] * 3, 1)["w"], w - w.mean(0, keepdim=True))


def test_one_task_leaves_the_gate_shut_without_a_warning():
    vectors = updates(1, (8, 5), seed=5, scale=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer = ace_layer([vectors[0]["layer.weight"]], eps=1e-2, gamma_threshold=0.3, k_fraction=0.3, stage=4,
                          prior="official")
    assert math.isnan(layer.gamma) and not layer.heterogeneous
    w = vectors[0]["layer.weight"]
    torch.testing.assert_close(ours(vectors, 2)["layer.weight"], w - w.mean(0, keepdim=True))


def test_gamma_moves_with_the_scale_of_the_updates():
    """Not scale invariant (the reference note's caveat 1): the same directions, all scaled by one factor, can
    cross the threshold, which is why DP's clipping and noise can open or shut the gate."""
    norms = [1.0, 4.0, 0.3, 2.0]
    small, unit, large = (heterogeneity([c * c * n for n in norms]) for c in (1e-3, 1.0, 3.0))
    assert small < 0.3 < unit and large < 0.3  # not even monotone: it peaks where mean log-trace is near 0


def test_a_refinement_with_no_direction_adds_nothing_instead_of_nan():
    """min(m, n) = 3 gives k = int(0.9) = 0: the official mean over no singular values is NaN everywhere."""
    vectors = updates(3, (3, 7), seed=6, spread=10.0, scale=0.05)
    matrices = [v["layer.weight"] for v in vectors]
    refined = ace_layer(matrices, eps=1e-2, gamma_threshold=0.3, k_fraction=0.3, stage=4, prior="official")
    assert refined.heterogeneous
    assert torch.isnan(official(vectors, 4)["layer.weight"]).all()
    torch.testing.assert_close(refined.merged, ace_layer(matrices, eps=1e-2, gamma_threshold=0.3, k_fraction=0.3,
                                                         stage=3, prior="official").merged)


def test_the_mean_covariance_prior_is_a_symmetric_ridge():
    """prior mean_cov: W0 = (sum_t W~_t R_t)(sum_t R_t + mean_t S_t)^-1, computed here by hand."""
    vectors = updates(3, (10, 6), seed=8)
    centred = [v["layer.weight"] - v["layer.weight"].mean(0, keepdim=True) for v in vectors]
    covariances = [c.T @ c for c in centred]
    ridged = [s + 1e-2 * torch.eye(6, dtype=torch.float64) for s in covariances]
    expected = sum(c @ r for c, r in zip(centred, ridged)) @ torch.linalg.inv(sum(ridged) + sum(covariances) / 3)
    torch.testing.assert_close(ours(vectors, 3, prior="mean_cov")["layer.weight"], expected)


def test_a_singular_system_is_solved_by_the_pseudo_inverse_with_a_warning():
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="blocks.0.weight is singular"):
        x = _solve_right(b, a, "blocks.0.weight")
    torch.testing.assert_close(x, b @ torch.linalg.pinv(a))


def test_convolutions_are_merged_as_matrices_only_with_include_conv():
    generator = torch.Generator().manual_seed(9)
    vectors = [{"conv": torch.randn(4, 3, 2, 2, generator=generator)} for _ in range(3)]
    assert torch.equal(merge("ace", vectors, include_conv=False)["conv"], merge("weight_averaging", vectors)["conv"])
    as_matrices = [{"conv": v["conv"].reshape(4, 12)} for v in vectors]
    torch.testing.assert_close(merge("ace", vectors)["conv"], merge("ace", as_matrices)["conv"].reshape(4, 3, 2, 2))


@pytest.mark.parametrize("bad,named", [({"stage": 5}, "stage"), ({"prior": "ridge"}, "prior"),
                                       ({"eps": 0.0}, "eps"), ({"k_fraction": 1.5}, "k_fraction")])
def test_bad_settings_are_refused_by_name(bad, named):
    with pytest.raises(ValueError, match=f"ace {named}"):
        check_hyperparameters("ace", bad)


def test_the_noise_floor_share_separates_a_low_rank_signal_from_white_noise():
    generator = torch.Generator().manual_seed(10)
    noise = 0.01 * torch.randn(200, 80, generator=generator, dtype=torch.float64)
    signal = torch.randn(200, 2, generator=generator, dtype=torch.float64) @ torch.randn(2, 80, generator=generator,
                                                                                         dtype=torch.float64)
    assert noise_floor_share(noise) < 0.05  # white noise: nothing stands above the floor
    assert noise_floor_share(signal + noise) > 0.95
    mixed = noise_floor_share(0.02 * signal + noise)  # a weak signal: part of the trace is floor
    assert 0.1 < mixed < 0.95
    assert math.isnan(noise_floor_share(torch.zeros(5, 4)))


def test_ace_gates_reads_released_vectors_and_writes_one_row_per_matrix_and_task(tmp_path):
    import pandas as pd

    from dpmerge.artifacts import save_tensors
    from dpmerge.stages.diagnose import ace_gates

    paths = []
    for t, vector in enumerate(updates(3, (12, 8), seed=11, spread=8.0, scale=0.05)):
        paths.append(tmp_path / f"tv{t}.safetensors")
        save_tensors(paths[-1], {k: v.float() for k, v in vector.items()}, {"task": f"task{t}"})
    out = tmp_path / "gates.parquet"
    ace_gates(task_vectors=[str(p) for p in paths], out=str(out))
    rows = pd.read_parquet(out)
    assert list(rows["task"]) == ["task0", "task1", "task2"]  # the bias is averaged by ACE: no row
    assert (rows["tensor"] == "layer.weight").all() and rows["gate_open"].all()
    assert rows["gamma"].iloc[0] == pytest.approx(heterogeneity(list(rows["squared_norm"])))
    assert rows["squared_norm"].is_monotonic_increasing  # task t scaled by 8**t
    assert rows["share_above_noise_floor"].between(0, 1).all()


def _gate_rows():
    """Two seeds of ace-gates rows: DP at epsilon 1 with the gate open on 1 of 2 matrices, DP-Merging shut."""
    import pandas as pd

    rows = []
    for seed in (0, 1):
        for method, opened in (("naive_dp", (True, False)), ("dp_merging", (False, False))):
            for tensor, gate in zip(("a.weight", "b.weight"), opened):
                for task in ("t1", "t2"):
                    rows.append({"backbone": "effnet", "method": method, "target_epsilon": 1.0, "seed": seed,
                                 "tensor": tensor, "task": task, "gamma": 0.5 if gate else 0.1, "gate_open": gate,
                                 "share_above_noise_floor": 0.2 + 0.1 * seed})
    return pd.DataFrame(rows)


def _score_rows():
    import pandas as pd

    rows = []
    for seed in (0, 1, 2):
        for operator in ("ace", "ties"):
            for method, epsilon, base in (("naive_dp", 1.0, 50), ("dp_merging", 1.0, 52), ("nonprivate", math.inf, 70)):
                for task, offset in (("t1", 0), ("t2", 10)):
                    rows.append({"backbone": "effnet", "method": method, "target_epsilon": epsilon, "seed": seed,
                                 "model": operator, "task": task, "score": base + offset + seed})
    return pd.DataFrame(rows)


def test_the_gate_summary_counts_matrices_once_and_averages_over_seeds():
    from dpmerge.report.ace_study import gate_summary

    summary = gate_summary(_gate_rows()).set_index("method")
    assert summary.loc["naive_dp", "gate_open"] == 0.5 and summary.loc["dp_merging", "gate_open"] == 0
    assert summary.loc["naive_dp", "matrices"] == 2 and summary.loc["naive_dp", "seeds"] == 2
    assert summary.loc["naive_dp", "floor"] == pytest.approx(0.25)  # seeds 0.2 and 0.3
    assert summary.loc["naive_dp", "gamma"] == pytest.approx(0.3)  # the median of 0.5 and 0.1


def test_the_score_summary_pairs_dp_merging_with_dp_by_seed():
    from dpmerge.report.ace_study import score_summary

    summary = score_summary(_score_rows(), ["ace", "ties"])
    private = summary[summary["epsilon"] == 1.0].set_index("operator")
    assert list(private.index) == ["ace", "ties"]
    assert private.loc["ace", "naive_dp_mean"] == pytest.approx(56)  # (50 + 60) / 2 + mean seed 1
    assert private.loc["ace", "difference"] == pytest.approx(2)
    assert private.loc["ace", "difference_low"] == pytest.approx(2)  # identical paired differences: no spread
    nonprivate = summary[summary["epsilon"] == math.inf].set_index("operator")
    assert nonprivate.loc["ties", "nonprivate_mean"] == pytest.approx(76)
    with pytest.raises(ValueError, match=r"no merged scores of \['iso_c'\]"):
        score_summary(_score_rows(), ["ace", "iso_c"])


@pytest.mark.slow
def test_ace_report_writes_both_tables_and_the_figure(tmp_path):
    from dpmerge.stages.report import ace_report

    gates, scores = tmp_path / "gates.parquet", tmp_path / "scores.parquet"
    _gate_rows().to_parquet(gates)
    _score_rows().to_parquet(scores)
    prefix = str(tmp_path / "ace_under_dp")
    ace_report(gates=[str(gates)], scores=[str(scores)], operators=["ace", "ties"], labels={"ace": "ACE E4"},
               out_prefix=prefix, figure=[str(tmp_path / "ace.png")])
    markdown = (tmp_path / "ace_under_dp_scores.md").read_text()
    assert "| effnet | ACE E4 | 1 |" in markdown and "TIES" in markdown and "+2.0" in markdown
    assert "| effnet | DP | 1 | 50 [50, 50] |" in (tmp_path / "ace_under_dp_gates.md").read_text()
    assert (tmp_path / "ace.png").stat().st_size > 10_000


def test_the_ace_preset_reads_every_merged_release_group(tmp_path):
    from workflow_runs import ROOT, job_counts

    counts = job_counts(tmp_path, "--configfile", str(ROOT / "presets/ace.yaml"))
    groups = 2 * 3 * (1 + 2 * 3)  # backbones x seeds x (non-private + 2 private methods x 3 budgets)
    assert counts["ace_gates"] == groups and counts["ace_report"] == 1
    # per group one job makes and scores the eight data-free merges; RegMean (private statistics) has its own
    assert counts["merge_group"] == groups and counts["merge"] == groups


def test_a_zero_update_with_the_gate_open_blows_up_as_in_the_official_code_and_is_warned():
    """Adaptive normalisation sets eps_t = eps / (tr(S_t) + 1e-12): 1e10 for a zero update (what denoising leaves
    of a pure-noise matrix). The official code's merge explodes there; ours equals it and says so."""
    vectors = updates(4, (12, 9), seed=7)
    for vector in vectors[:2]:
        vector["layer.weight"] = torch.zeros_like(vector["layer.weight"])
    with pytest.warns(RuntimeWarning, match="is \\(near\\) zero while the gate is open"):
        merged = ours(vectors, stage=4)
    reference = official(vectors, stage=4)
    assert torch.allclose(merged["layer.weight"], reference["layer.weight"], rtol=1e-6)
    largest_input = max(float(v["layer.weight"].norm()) for v in vectors)
    assert float(merged["layer.weight"].norm()) > 1e3 * largest_input
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gate shut (stage 1): no normalisation, no warning
        ours(vectors, stage=1)
