"""The denoised-releases study: its config (merge.<entry>.denoise, denoise_study), its readings computed per seed
and paired (report/denoise_study.py) on score frames whose differences are known, and what it reads from the
denoised vectors' metadata."""

import re

import numpy as np
import pandas as pd
import pytest
import yaml

from dpmerge.config_check import SCHEMA, ConfigError, check_config
from dpmerge.merge.specs import DENOISERS
from dpmerge.report.denoise_study import noise_summary, parse_pairs, score_summary
from dpmerge.report.labels import operator_label
from workflow_runs import TINY


def study_config(**changes):
    config = yaml.safe_load(yaml.safe_dump(TINY))
    config["merge"]["ties_denoised"] = {"operator": "ties", "density": 0.2, "denoise": "svd_shrink"}
    config["denoise_study"] = {"operators": ["ties_denoised"]}
    for key, value in changes.items():
        config[key] = value
    return config


def test_the_schema_offers_exactly_the_denoisers_the_code_has():
    schema = yaml.safe_load(SCHEMA.read_text())
    entry = schema["properties"]["merge"]["additionalProperties"]["properties"]["denoise"]
    assert entry["enum"] == list(DENOISERS)


def test_a_denoise_study_config_passes_and_its_entries_keep_only_the_operators_hyperparameters():
    from dpmerge.config_check import merge_hyperparameters
    from dpmerge.config_fields import denoised_counterpart

    config = study_config()
    check_config(config)
    assert denoised_counterpart(config, "ties_denoised") == "ties"
    assert denoised_counterpart(config, "ties") is None
    assert merge_hyperparameters(config, "ties_denoised") == {"density": 0.2}  # denoise is not the operator's


@pytest.mark.slow
@pytest.mark.parametrize("change,message", [
    (lambda c: c["denoise_study"].update(operators=["ties_twice"]), "denoise_study.operators: 'ties_twice' is not"),
    (lambda c: c["denoise_study"].update(operators=["ties"]), "denoise_study.operators: 'ties' has no denoise"),
    (lambda c: c["merge"]["ties_denoised"].update(density=0.5),
     "denoise_study.operators: 'ties_denoised' has no entry with the same operator and settings"),
    (lambda c: c.update(methods=["naive_dp"]), "denoise_study: its question compares naive_dp and dp_merging"),
    (lambda c: c["merge"]["ties_denoised"].update(denoise="wiener"), "merge.ties_denoised.denoise"),
    (lambda c: c["diagnostics"]["curvature"].update(operator="ties_denoised"),
     "diagnostics.curvature.operator: 'ties_denoised' merges denoised releases"),
    (lambda c: c.update(mix={"targets": [6], "methods": ["naive_dp"], "operator": "ties_denoised"}),
     "mix.operator: 'ties_denoised' merges denoised releases"),
])
def test_a_denoise_config_that_cannot_run_is_refused_naming_the_field(change, message):
    config = study_config()
    change(config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)


def _scores(rows):
    return pd.DataFrame(rows, columns=["backbone", "method", "target_epsilon", "seed", "model", "source_task",
                                       "task", "score"])


def _frames(seeds=(0, 1, 2, 3)):
    """Two tasks, one budget. Per seed s: DP merges at 20 + s, denoised DP at 30 + 2s, DP-Merging at 25 + s,
    denoised DP-Merging at 26 + s, Pretrained at 40 - s (the task mean; the tasks differ by +-5)."""
    merged, pretrained = [], []
    arms = {("naive_dp", "ties"): lambda s: 20 + s, ("naive_dp", "ties_denoised"): lambda s: 30 + 2 * s,
            ("dp_merging", "ties"): lambda s: 25 + s, ("dp_merging", "ties_denoised"): lambda s: 26 + s}
    for s in seeds:
        for (method, model), value in arms.items():
            for task, offset in (("a", -5), ("b", 5)):
                merged.append(("effnet", method, 4.0, s, model, "merged", task, value(s) + offset))
        for task, offset in (("a", -5), ("b", 5)):
            pretrained.append(("effnet", "pretrained_head", 4.0, s, "individual", task, task, 40 - s + offset))
            # a cross-task score, which the Pretrained row must not read
            pretrained.append(("effnet", "pretrained_head", 4.0, s, "individual", task, "zz", 0.0))
    return _scores(merged), _scores(pretrained)


def test_the_readings_are_paired_by_seed_and_equal_what_was_built_in():
    merged, pretrained = _frames()
    row = score_summary(merged, pretrained, {"ties_denoised": "ties"}).iloc[0]
    seeds = np.arange(4)
    assert row["dp_mean"] == pytest.approx(np.mean(20 + seeds))
    assert row["pretrained_mean"] == pytest.approx(np.mean(40 - seeds))
    assert row["denoise_gain_dp"] == pytest.approx(np.mean(10 + seeds))  # (30 + 2s) - (20 + s)
    assert row["dp_denoised_vs_dpm"] == pytest.approx(np.mean(5 + seeds))
    # the same gain at every seed: an interval of width 0
    assert row["denoise_gain_dpm"] == row["denoise_gain_dpm_low"] == row["denoise_gain_dpm_high"] == pytest.approx(1)
    assert row["dp_denoised_vs_pretrained"] == pytest.approx(np.mean(-10 + 3 * seeds))
    # paired: the interval of (30 + 2s) - (20 + s) is that of 10 + s, narrower than unpaired arms would give
    half = row["denoise_gain_dp_high"] - row["denoise_gain_dp"]
    from scipy.stats import t
    assert half == pytest.approx(t.ppf(0.975, 3) * np.std(10 + seeds, ddof=1) / 2)
    assert row["denoise_gain_dp_seeds"] == 4


def test_a_missing_seed_drops_out_of_the_pairs_not_into_a_wrong_one():
    merged, pretrained = _frames()
    merged = merged[~((merged["seed"] == 3) & (merged["model"] == "ties_denoised") & (merged["method"] == "naive_dp"))]
    row = score_summary(merged, pretrained, {"ties_denoised": "ties"}).iloc[0]
    assert row["denoise_gain_dp_seeds"] == 3 and row["denoise_gain_dp"] == pytest.approx(np.mean(10 + np.arange(3)))
    assert row["denoise_gain_dpm_seeds"] == 4


def test_a_pair_without_scores_is_named():
    merged, pretrained = _frames()
    with pytest.raises(ValueError, match="no merged scores of \\['ta', 'ta_denoised'\\]"):
        score_summary(merged, pretrained, {"ta_denoised": "ta"})
    with pytest.raises(ValueError, match="DENOISED=PLAIN"):
        parse_pairs(["ties_denoised"])


def test_the_noise_table_reads_what_denoising_recorded():
    def meta(seed, kept):
        return {"backbone": "effnet", "method": "naive_dp", "target_epsilon": 4.0, "seed": seed, "task": "a",
                "denoised": {"method": "svd_shrink", "pooled_noise_level": 0.01 * (seed + 1), "tensors": {
                    "w1": {"how": "spectral", "kept_rank": kept, "kept_energy": 0.5 if kept else 0.0},
                    "w2": {"how": "spectral", "kept_rank": 0.0, "kept_energy": 0.0},
                    "b": {"how": "james_stein", "kept_rank": None, "kept_energy": 0.25}}}}

    row = noise_summary([meta(0, 3.0), meta(1, 0.0)]).iloc[0]
    assert row["noise_level"] == pytest.approx(0.015)
    assert row["matrices_kept"] == pytest.approx(0.25)  # seed 0: 1 of 2 matrices, seed 1: none
    assert row["energy_kept"] == pytest.approx(0.125)
    assert row["vector_factor"] == pytest.approx(0.5)  # James-Stein factor sqrt(0.25)
    with pytest.raises(ValueError, match="lacks its 'denoised' metadata"):
        noise_summary([{"task": "a"}])


def test_denoised_and_ace_stage_entries_get_readable_labels():
    assert operator_label("ties_denoised") == "TIES, denoised"
    assert operator_label("ace_e2") == "ACE E2"
    assert operator_label("my_merge") == "my_merge"
