"""The config checks of the studies beyond the main grid, each a section of its own: the effective-noise study
(noise_scale), releases at other budgets (mix, mix.combine), ACE under DP (ace_study) and denoised releases
(merge.<entry>.denoise, denoise_study). config_check.check_config calls `check_studies` after the main grid's checks.
"""

from __future__ import annotations

from dpmerge.config_fields import (
    ConfigError,
    check_data_free_merge,
    denoised_counterpart,
    finetune_settings,
    merge_operator,
    released_budgets,
)
from dpmerge.epsilon import eps_label
from dpmerge.merge.specs import SPECS as OPERATORS
from dpmerge.methods import BASELINE, METHODS, PROPOSED


def check_studies(config: dict) -> None:
    _check_mix(config)
    _check_noise_scale(config)
    _check_ace_study(config)
    _check_denoise_study(config)


def _check_denoise_study(config):
    """Each listed entry denoises its inputs and has a plain twin to be compared with; the study's question
    needs the baseline and the proposed method."""
    names = config["denoise_study"]["operators"]
    for name in names:
        if name not in config["merge"]:
            raise ConfigError(f"denoise_study.operators: {name!r} is not among the configured merges "
                              f"({', '.join(config['merge'])})")
        if "denoise" not in config["merge"][name]:
            raise ConfigError(f"denoise_study.operators: {name!r} has no denoise; list the merge entries that "
                              "denoise their inputs (e.g. ta_denoised: {operator: task_arithmetic, scaling: 0.3, "
                              "denoise: svd_shrink})")
        if denoised_counterpart(config, name) is None:
            raise ConfigError(f"denoise_study.operators: {name!r} has no entry with the same operator and settings "
                              "without denoise to be compared with; add one")
        if OPERATORS[merge_operator(config, name)].personalized:
            raise ConfigError(f"denoise_study.operators: {name!r} gives one model per task; the study compares merges")
    missing = [m for m in (BASELINE, PROPOSED) if m not in config["methods"]]
    if names and missing:
        raise ConfigError(f"denoise_study: its question compares {BASELINE} and {PROPOSED} releases; add "
                          f"{', '.join(missing)} to methods")


def _check_ace_study(config):
    for name in config["ace_study"]["operators"]:
        if name not in config["merge"]:
            raise ConfigError(f"ace_study.operators: {name!r} is not among the configured merges "
                              f"({', '.join(config['merge'])})")
        if OPERATORS[merge_operator(config, name)].personalized:
            raise ConfigError(f"ace_study.operators: {name!r} gives one model per task; the study compares merges")


def _check_noise_scale(config):
    study = config["noise_scale"]
    if not study["methods"]:
        return
    for method in study["methods"]:
        if method not in METHODS or METHODS[method].head_only:
            raise ConfigError(f"noise_scale.methods: {method!r} must be a method that releases a task vector "
                              f"({', '.join(m for m in METHODS if not METHODS[m].head_only)})")
    for backbone in study["backbones"]:
        if backbone not in config["backbones"]:
            raise ConfigError(f"noise_scale.backbones: {backbone!r} is not one of backbones "
                              f"({', '.join(config['backbones'])})")
    if study["seeds"] > len(config["seeds"]):
        raise ConfigError(f"noise_scale.seeds: {study['seeds']} but the study has {len(config['seeds'])} seed(s)")
    if 1 in [float(f) for f in study["lr_factors"]]:
        raise ConfigError("noise_scale.lr_factors: 1 is the configured run, which the study already has; drop it")
    check_data_free_merge(config, study["operator"], "noise_scale.operator",
                           "the study reads one merged model per release group")
    for backbone in study["backbones"] or config["backbones"]:
        for method in study["methods"]:
            settings = finetune_settings(config, backbone, method)
            lr = float(settings["lr"])
            for factor in [1.0, *study["lr_factors"]]:
                for decay in [settings["weight_decay"], *study["weight_decays"]]:
                    if not lr * factor * float(decay) < 1:
                        raise ConfigError(f"noise_scale: lr {lr * factor:g} x weight decay {decay:g} on {backbone} "
                                          f"({method}) is not below 1; AdamW would flip the weights' sign each step")


def _check_mix(config):
    mix = config["mix"]
    if not mix["targets"]:
        return
    for method in mix["methods"]:
        if method not in config["methods"] or not METHODS[method].private or METHODS[method].head_only:
            raise ConfigError(f"mix.methods: {method!r} must be one of the configured private methods that release "
                              f"a task vector ({', '.join(config['methods'])})")
    check_data_free_merge(config, mix["operator"], "mix.operator", "mixtures are merged data-free into one model")
    for backbone in config["backbones"]:
        for method in mix["methods"]:
            budgets = released_budgets(config, backbone, method)
            for target in mix["targets"]:
                components = [b for b in budgets if eps_label(b) != eps_label(target)]
                if not components or min(components) >= target:
                    raise ConfigError(f"mix.targets: {target} on {backbone} needs a release of {method} at a smaller "
                                      f"budget; it is released at {budgets} (epsilons and sweeps.epsilon.epsilons)")
    _check_combine(config)


def _check_combine(config):
    mix, combine = config["mix"], config["mix"]["combine"]
    if not combine["copies"]:
        return
    if combine["copies"] < 2 or combine["copies"] > len(config["seeds"]):
        raise ConfigError(f"mix.combine.copies: {combine['copies']} must be 2 or more and at most the number of seeds "
                          f"({len(config['seeds'])}): each combination averages that many independent repetitions")
    if eps_label(combine["target"]) not in {eps_label(t) for t in mix["targets"]}:
        raise ConfigError(f"mix.combine.target: {combine['target']:g} must be one of mix.targets {mix['targets']}, "
                          f"where the combination is compared with selection")
    if not combine["budget"] < combine["target"]:
        raise ConfigError(f"mix.combine.budget: {combine['budget']:g} must be below mix.combine.target "
                          f"{combine['target']:g}: a combination spends more than each of its components")
    for backbone in config["backbones"]:
        for method in mix["methods"]:
            budgets = released_budgets(config, backbone, method)
            if eps_label(combine["budget"]) not in {eps_label(b) for b in budgets}:
                raise ConfigError(f"mix.combine.budget: {combine['budget']:g} is not a released budget of {method} on "
                                  f"{backbone} ({budgets}: epsilons and sweeps.epsilon.epsilons)")
