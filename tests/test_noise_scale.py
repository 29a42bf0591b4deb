"""The effective noise scale T = lr x D x sqrt(s_sample^2 + s_dp^2) (diagnostics/noise_scale.py): each piece checked
on a toy run against what the run's mechanism and optimizer actually do; the report's summary; the study's
configuration checks; the ledger telling swept runs apart. The workflow's noise_scale and noise_report rules run in
tests/test_audit.py's tiny workflow."""

import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from brute_force import brute_force_clipped_sum
from conftest import keyed
from dpmerge.diagnostics.noise_scale import (
    decay_factor,
    dp_noise_std,
    effective_noise,
    mean_gradient_square,
    per_example_gradient_moments,
    sampling_noise,
    sampling_noise_bound,
)
from dpmerge.models.base import TaskModel
from dpmerge.privacy.randomness import GeneratorStream
from dpmerge.training.dp_step import privatized_gradient
from dpmerge.training.finetune import FinetuneConfig, train
from dpmerge.training.persample import make_clipper


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["naive_dp", "dp_merging"])
def test_the_dp_piece_is_the_spread_of_the_runs_own_privatized_gradient(toy_backbone, toy_data, method):
    """s_dp = sigma C / B read from a toy run's record is the per-coordinate std of the privatized gradient that run's
    mechanism hands the optimizer (the same batch queried again and again: only the noise varies)."""
    features, labels = toy_data
    config = FinetuneConfig(method=method, target_epsilon=2.0, epochs=1.0, batch_size=8, lr=1e-2, clip_norm=0.5)
    record = train(toy_backbone, 3, features, labels, config, **keyed(method=method), log=lambda _: None).record
    settings = record["hyperparameters"]
    predicted = dp_noise_std(record["noise_multiplier"], record["clip_norm"], settings["batch_size"])
    model = TaskModel(toy_backbone, 3)
    clipper = make_clipper(model, "functorch")
    noise = GeneratorStream(torch.Generator().manual_seed(3))
    batch = (tuple(f[:8] for f in features), labels[:8])
    draws = torch.stack([_flat(privatized_gradient(
        clipper, *batch, clip_norm=record["clip_norm"], noise_multiplier=record["noise_multiplier"],
        expected_batch_size=settings["batch_size"], noise=noise)) for _ in range(300)])
    clipper.close()
    measured = float(draws.std(dim=0).pow(2).mean().sqrt())
    assert measured == pytest.approx(predicted, rel=0.03)
    if method == "dp_merging":  # two queries per batch: sigma (so s_dp) sqrt(2) x naive DP's at the same budget
        naive = train(toy_backbone, 3, features, labels, FinetuneConfig(
            method="naive_dp", target_epsilon=2.0, epochs=1.0, batch_size=8, lr=1e-2, clip_norm=0.5),
            **keyed(method="naive_dp"), log=lambda _: None).record
        assert predicted == pytest.approx(math.sqrt(2) * naive["noise_multiplier"] * 0.5 / 8, rel=1e-4)


def test_the_sampling_piece_is_the_spread_of_poisson_batches_of_clipped_gradients(toy_backbone, toy_data):
    """s_sample^2 = (1 - q) m / B from per-example moments equals the variance, over Poisson batches at rate q,
    of sum_{i in batch} clip_C(g_i) / B on the same examples (what a noiseless private step would add)."""
    features, labels = toy_data
    model = TaskModel(toy_backbone, 3)
    params = [p for p in model.parameters() if p.requires_grad]
    clip, batch = 0.3, 16.0
    rate = batch / labels.shape[0]
    second_moment, variance = per_example_gradient_moments(model, params, features, labels, clip)
    per_example = torch.stack([_flat(brute_force_clipped_sum(model, tuple(f[i:i + 1] for f in features),
                                                             labels[i:i + 1], clip)) for i in range(len(labels))])
    assert second_moment == pytest.approx(float(per_example.pow(2).mean()), rel=1e-5)
    assert variance == pytest.approx(float(per_example.var(dim=0).mean()), rel=1e-5)
    assert mean_gradient_square(second_moment, variance, len(labels)) == pytest.approx(
        float(per_example.mean(dim=0).pow(2).mean()), rel=1e-4)
    generator = torch.Generator().manual_seed(11)
    included = (torch.rand(20000, len(labels), generator=generator) < rate).double()
    sums = included @ per_example.double() / batch
    measured = float(sums.var(dim=0).mean().sqrt())
    assert measured == pytest.approx(sampling_noise(second_moment, batch, rate), rel=0.05)
    # the data-free bound: ||clip_C(g)|| <= C, whatever the data
    dimension = per_example.shape[1]
    assert measured <= sampling_noise_bound(clip, batch, rate, dimension) * 1.05


def test_the_decay_piece_is_adamws_own_shrinkage_averaged_over_the_run():
    """D = mean_k (1 - lr wd)^-k: with no gradient AdamW only decays, and the inverse of the weights' shrinkage,
    averaged over the K steps, is D."""
    lr, decay, steps = 0.05, 2.0, 20
    weight = torch.nn.Parameter(torch.linspace(1.0, 2.0, 10))
    optimizer = torch.optim.AdamW([weight], lr=lr, weight_decay=decay)
    start = float(weight.detach().norm())
    growth = []
    for _ in range(steps):
        growth.append(start / float(weight.detach().norm()))
        weight.grad = torch.zeros_like(weight)
        optimizer.step()
    assert decay_factor(lr, decay, steps) == pytest.approx(np.mean(growth), rel=1e-5)
    assert decay_factor(lr, 0.0, steps) == 1.0 and decay_factor(lr, decay, 0) == 1.0
    with pytest.raises(ValueError, match="1 - lr \\* wd"):
        decay_factor(0.5, 2.0, 10)


def test_effective_noise_combines_the_pieces_and_scales_with_lr_and_batch():
    base = dict(lr=1e-3, weight_decay=0.0, steps=10, batch_size=64.0, sample_rate=64 / 1200, noise_multiplier=1.0,
                clip_norm=0.2, second_moment=1e-6)
    pieces = effective_noise(**base)
    assert pieces["s_dp"] == pytest.approx(0.2 / 64)
    assert pieces["noise_scale"] == pytest.approx(1e-3 * math.hypot(pieces["s_dp"], pieces["s_sample"]))
    assert pieces["noise_scale_dp"] + pieces["noise_scale_sampling"] == pytest.approx(pieces["noise_scale"])
    assert pieces["noise_scale_dp"] / pieces["noise_scale"] == pytest.approx(pieces["dp_variance_share"])
    # a signal as large as the noise: Adam divides by sqrt(2) s, so T = lr s^2 / (sqrt(2) s)
    signal = effective_noise(**base, mean_square=pieces["noise_std"] ** 2)
    assert signal["noise_scale"] == pytest.approx(pieces["noise_scale"] / math.sqrt(2))
    assert signal["noise_share_of_rms"] == pytest.approx(1 / math.sqrt(2)) and pieces["noise_share_of_rms"] == 1
    assert effective_noise(**{**base, "lr": 4e-3})["noise_scale"] == pytest.approx(4 * pieces["noise_scale"])
    # without privacy only the sampling noise is left, and Adam's T follows sqrt(1/B) (square-root scaling)
    plain = effective_noise(**{**base, "noise_multiplier": 0.0, "clip_norm": None})
    quarter = effective_noise(**{**base, "noise_multiplier": 0.0, "clip_norm": None, "batch_size": 16.0,
                                 "sample_rate": 16 / 1200})
    assert plain["s_dp"] == 0 and plain["dp_variance_share"] == 0
    assert quarter["noise_scale"] / plain["noise_scale"] == pytest.approx(
        2 * math.sqrt((1 - 16 / 1200) / (1 - 64 / 1200)))


def _rows(backbone, method, label, sweep, eps, noise_scales, normalized, barrier=0.1, seed=0, lr=1e-3):
    return [{"backbone": backbone, "method": method, "label": label, "sweep": sweep, "target_epsilon": eps,
             "seed": seed, "task": f"t{i}", "lr": lr, "batch_size": 64.0, "weight_decay": 0.01, "steps": 10,
             "noise_multiplier": 0.0 if math.isinf(eps) else 1.0, "noise_scale": t,
             "noise_scale_dp": 0.0 if math.isinf(eps) else t, "noise_scale_sampling": t, "effective_lr": 1e-3,
             "noise_share_of_rms": 1.0,
             "s_dp": 0.0 if math.isinf(eps) else 1.0, "s_sample": 1.0, "dp_variance_share": 0.5, "decay_factor": 1.0,
             "individual_score": 80.0, "merged_score": 80.0 * n, "normalized_merged": n, "barrier": barrier}
            for i, (t, n) in enumerate(zip(noise_scales, normalized))]


@pytest.mark.slow
def test_group_summary_takes_geometric_means_and_measures_from_the_nonprivate_group_of_largest_gain(tmp_path):
    from dpmerge.report.noise_scale import group_summary, plot_noise_scale, setting_summary, write_noise_table

    rows = pd.DataFrame(
        _rows("b", "nonprivate", "nonprivate", "centre", math.inf, [1e-6, 4e-6], [0.9, 0.7])
        + _rows("b", "nonprivate", "nonprivate-lr0.004", "lr", math.inf, [4e-6, 16e-6], [0.95, 0.85], lr=4e-3)
        + _rows("b", "naive_dp", "naive_dp", "centre", 4.0, [1e-4, 1e-4], [0.5, 0.3]))
    summary = group_summary(rows).set_index("label")
    assert summary.loc["nonprivate", "noise_scale"] == pytest.approx(2e-6)
    assert summary.loc["nonprivate", "normalized_merged"] == pytest.approx(80.0)
    assert summary.loc["nonprivate-lr0.004", "merge_gain"] == pytest.approx(80 * (0.9 - 1))
    assert np.allclose(summary["optimum_noise_scale"], 8e-6)  # the lr group loses least by merging
    assert summary.loc["naive_dp", "log10_from_optimum"] == pytest.approx(math.log10(1e-4 / 8e-6))
    assert summary.loc["nonprivate", "noise_scale_dp"] == 0.0  # no NaN from a geometric mean of zeros
    settings = setting_summary(group_summary(rows))
    assert np.allclose(settings.set_index("label")["noise_scale"], summary["noise_scale"])  # one seed: as is
    assert settings["merge_gain_low"].isna().all()  # one seed: no interval
    write_noise_table(settings, str(tmp_path / "noise"))
    markdown = (tmp_path / "noise.md").read_text()
    assert "| learning rate | lr × 4 | inf | 1 |" in markdown and "| configured | as configured | 4 | 1 |" in markdown
    assert pd.read_parquet(tmp_path / "noise.parquet")["noise_scale"].dtype.kind == "f"
    plot_noise_scale(settings, [str(tmp_path / "noise.png")])
    assert (tmp_path / "noise.png").stat().st_size > 0


def _seeded_study():
    """Three seeds of a non-private configured and 4 x lr run and two private methods at three settings each, with
    gains (merged - own) and T chosen so every reading has a known answer."""
    rows = []
    # non-private: the lr run gains more on average (-5 vs -8) though seed 0 alone says the opposite
    for seed, (centre, fast) in enumerate([(-4.0, -6.0), (-10.0, -4.0), (-10.0, -5.0)]):
        rows += _rows("b", "nonprivate", "nonprivate", "centre", math.inf, [1e-6] * 2, [1 + centre / 80] * 2,
                      seed=seed)
        rows += _rows("b", "nonprivate", "nonprivate-lr0.004", "lr", math.inf, [4e-6] * 2, [1 + fast / 80] * 2,
                      seed=seed, lr=4e-3)
    # private: DP-Merging's gain = DP's + (3, 5, 7) by seed at every setting; T rises over the settings while DP's
    # gain falls with it, except at seed 2 where the two larger settings swap
    for seed, shift in enumerate([3.0, 5.0, 7.0]):
        for method, lr, extra in (("naive_dp", 5e-3, 0.0), ("dp_merging", 5e-3, shift)):
            settings = [(method, "centre", 4.0, 1e-5, lr), (f"{method}-lr0.02", "lr", 4.0, 1e-4, 4 * lr),
                        (method, "epsilon", 1.0, 1e-3, lr)]
            gains = [-10.0, -20.0, -30.0] if seed < 2 else [-10.0, -30.0, -20.0]
            for (label, sweep, eps, t, run_lr), gain in zip(settings, gains):
                rows += _rows("b", method, label, sweep, eps, [t] * 2, [1 + (gain + extra) / 80] * 2, seed=seed,
                              lr=run_lr)
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_settings_average_seeds_and_the_readings_pair_them():
    from scipy.stats import t as student_t

    from dpmerge.report.noise_readings import noise_readings, write_readings_table
    from dpmerge.report.noise_scale import group_summary, plot_noise_scale, setting_summary, write_noise_table

    per_seed = group_summary(_seeded_study())
    # T* is the non-private setting of largest mean gain over seeds (the lr run), not seed 0's best
    assert np.allclose(per_seed["optimum_noise_scale"], 4e-6)
    settings = setting_summary(per_seed).set_index(["method", "setting"])
    assert settings["seeds"].eq(3).all()
    centre = settings.loc[("nonprivate", "as configured")]
    half = student_t.ppf(0.975, 2) * np.std([-4.0, -10.0, -10.0], ddof=1) / math.sqrt(3)
    assert centre["merge_gain"] == pytest.approx(-8.0)
    assert (centre["merge_gain_low"], centre["merge_gain_high"]) == pytest.approx((-8.0 - half, -8.0 + half))
    assert settings.loc[("naive_dp", "lr × 4"), "log10_from_optimum"] == pytest.approx(math.log10(1e-4 / 4e-6))
    assert settings.loc[("naive_dp", "lr × 4"), "merge_gain_high"] > settings.loc[("naive_dp", "lr × 4"),
                                                                                    "merge_gain"]

    table = noise_readings(per_seed)  # columns in a fixed order: the Parquet is the same file every run
    assert list(table.columns) == ["backbone", "reading", "subject", "setting", "estimate", "seeds", "low", "high"]
    readings = table.set_index(["reading", "subject", "setting"])
    # (b) DP-Merging - DP: (3, 5, 7) at every setting, so 5 with the t-interval of those three values
    half = student_t.ppf(0.975, 2) * np.std([3.0, 5.0, 7.0], ddof=1) / math.sqrt(3)
    for setting in ("as configured", "lr × 4", "eps 1", "mean over 3 settings"):
        paired = readings.loc[("(b) merged − own", "DP-Merging − DP", setting)]
        assert paired["estimate"] == pytest.approx(5.0) and paired["seeds"] == 3
        assert (paired["low"], paired["high"]) == pytest.approx((5.0 - half, 5.0 + half))
    # (c) rho over the three settings: -1 at seeds 0 and 1, -0.5 at seed 2
    rho = readings.loc[("(c) Spearman ρ(log T, merged − own)", "DP", "over 3 settings")]
    assert rho["estimate"] == pytest.approx((-1 - 1 - 0.5) / 3) and rho["low"] == -1.0 and rho["high"] < 0
    # (a) the configured DP run's distance from T*, the same at every seed
    distance = readings.loc[("(a) log10 T/T*", "DP", "as configured")]
    assert distance["estimate"] == pytest.approx(math.log10(1e-5 / 4e-6)) and distance["seeds"] == 3
    # exploratory: non-private 4 x lr - configured, paired: (-2, 6, 5)
    faster = readings.loc[("exploratory: merged − own, setting − configured", "Non-private", "lr × 4")]
    assert faster["estimate"] == pytest.approx(3.0)
    with pytest.raises(KeyError):  # a method without a configured run is not paired with itself
        readings.loc[("(a) log10 T/T*", "Non-private", "as configured")]

    write_noise_table(setting_summary(per_seed), str(tmp := Path(tempfile.mkdtemp())) + "/noise")
    write_readings_table(noise_readings(per_seed), str(tmp / "readings"))
    assert "| b | (b) merged − own | DP-Merging − DP | eps 1 | +5.00 |" in (tmp / "readings.md").read_text()
    assert pd.read_parquet(tmp / "readings.parquet")["low"].dtype.kind == "f"
    plot_noise_scale(setting_summary(per_seed), [str(tmp / "noise.png")])  # with bars over seeds
    assert (tmp / "noise.png").stat().st_size > 0


def test_the_ledger_tells_swept_runs_of_one_method_apart():
    """A learning-rate variant is another release of the task (its own group, composed), not the same group twice."""
    from dpmerge.privacy.ledger import check_ledger, ledger_of_records

    def record(lr):
        return {"backbone": "b", "task": "t", "method": "naive_dp", "target_epsilon": 4.0, "spent_epsilon": 3.9,
                "delta": 1e-3, "noise_multiplier": 1.0, "sample_rate": 0.05, "steps": 10, "clip_norm": 0.2,
                "queries_per_step": 1, "steps_by_queries": {"1": 10}, "accountant": "rdp", "sampling": "poisson",
                "neighbouring": "add_remove", "randomness": "keyed", "seed": 0, "rho": 0.0, "anchor_lambda": 0.0,
                "pretrained_sha256": "x", "w0_sha256": "y", "num_train_examples": 1000,
                "hyperparameters": {"lr": lr, "batch_size": 64, "weight_decay": 0.01}}

    twice = [problem for problem in check_ledger(ledger_of_records([("a", record(1e-3)), ("b", record(1e-3))]))
             if "released twice" in problem]
    assert twice
    swept = check_ledger(ledger_of_records([("a", record(1e-3)), ("b", record(4e-3))]))
    assert not [problem for problem in swept if "released twice" in problem]


@pytest.mark.parametrize("study,message", [
    ({"methods": ["pretrained_head"]}, "noise_scale.methods: 'pretrained_head' must be a method"),
    ({"methods": ["naive_dp"], "lr_factors": [1]}, "noise_scale.lr_factors: 1 is the configured run"),
    ({"methods": ["naive_dp"], "weight_decays": [400]}, "is not below 1"),
    ({"methods": ["naive_dp"], "operator": "emr"}, "noise_scale.operator"),
    ({"methods": ["naive_dp"], "backbones": ["nope"]}, "noise_scale.backbones: 'nope'"),
])
def test_the_study_refuses_a_bad_configuration_by_field(study, message):
    import yaml

    from dpmerge.config_check import ConfigError, check_config
    from workflow_runs import ROOT

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["merge"]["emr"] = {}
    config["noise_scale"] = study
    with pytest.raises(ConfigError, match=message):
        check_config(config)
