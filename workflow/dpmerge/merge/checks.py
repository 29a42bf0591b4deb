"""Which hyperparameter values each merge operator accepts, checked before anything is read: by the config
check before any job runs (so `ties: {density: 2.0}` stops the dry run) and by every merge (merge.registry).

Standard library only, like merge/specs.py whose defaults these checks complete: the config check and the
Snakefile import it without torch. `check_hyperparameters` is the one entry point; every error is a ValueError
that names the operator, the hyperparameter and what it must be.
"""

from __future__ import annotations

from dpmerge.merge.specs import SPECS


def check_include_conv(include_conv):
    if not isinstance(include_conv, bool):
        raise ValueError(f"include_conv must be true or false, got {include_conv!r}")


def check_choice(operator: str, name: str, value, choices: tuple[str, ...]):
    if value not in choices:
        allowed = " or ".join(repr(c) for c in choices)
        raise ValueError(f"{operator} {name} must be {allowed}, got {value!r}")


def _ties_check(density, scaling, merge_func, topk_scope, trim, zero_sign):
    if not 0 <= density <= 1:
        raise ValueError(f"ties density must be in [0, 1], got {density}")
    check_choice("ties", "merge_func", merge_func, ("mean", "sum"))
    check_choice("ties", "topk_scope", topk_scope, ("global", "per_tensor"))
    check_choice("ties", "trim", trim, ("round", "reference"))
    check_choice("ties", "zero_sign", zero_sign, ("none", "majority"))
    if trim == "reference" and density == 1:
        # the reference asks kthvalue for rank 0 there and fails; keeping everything would be our invention
        raise ValueError("ties density must be < 1 with trim 'reference' (the TIES code cannot keep every entry)")


def _dare_check(drop_rate, scaling, seed):
    if not 0 <= drop_rate < 1:
        raise ValueError(f"dare drop_rate must be in [0, 1), got {drop_rate}")


def _pcb_check(ratio, scaling):
    if not 0 < ratio <= 1:
        raise ValueError(f"pcb ratio must be in (0, 1], got {ratio}")


def _wudi_check(iterations, lr, scaling, include_conv):
    if not isinstance(iterations, int) or iterations < 0:
        raise ValueError(f"wudi iterations must be a non-negative integer, got {iterations!r}")
    if not lr > 0:
        raise ValueError(f"wudi lr must be positive, got {lr}")
    check_include_conv(include_conv)


def _svd_check(scaling, include_conv, **_):
    check_include_conv(include_conv)


def _tsvm_check(scaling, include_conv, short_matrices):
    check_include_conv(include_conv)
    check_choice("tsv_m", "short_matrices", short_matrices, ("average", "zero"))


def _iso_cts_check(scaling, common_space_fraction, include_conv):
    if not 0 <= common_space_fraction <= 1:
        raise ValueError(f"iso_cts common_space_fraction must be in [0, 1], got {common_space_fraction}")
    check_include_conv(include_conv)


def _consensus_check(scaling, tall_mask_lambda, min_agreement):
    if not tall_mask_lambda >= 0:
        raise ValueError(f"consensus tall_mask_lambda must be >= 0, got {tall_mask_lambda}")
    if not isinstance(min_agreement, int) or min_agreement < 0:
        raise ValueError(f"consensus min_agreement must be a non-negative integer, got {min_agreement!r}")


def _tall_check(tall_mask_lambda):
    if not tall_mask_lambda >= 0:
        raise ValueError(f"tall_masks tall_mask_lambda must be >= 0, got {tall_mask_lambda}")


def _dts_check(rank_fraction, include_conv):
    if not 0 < rank_fraction <= 1:
        raise ValueError(f"dts rank_fraction must be in (0, 1], got {rank_fraction}")
    check_include_conv(include_conv)


def _ace_check(eps, gamma_threshold, k_fraction, scaling, stage, prior, include_conv):
    if not eps > 0:
        raise ValueError(f"ace eps must be positive (it keeps the system invertible), got {eps}")
    if not gamma_threshold >= 0:
        raise ValueError(f"ace gamma_threshold must be >= 0, got {gamma_threshold}")
    if not 0 <= k_fraction <= 1:
        raise ValueError(f"ace k_fraction must be in [0, 1], got {k_fraction}")
    if stage not in (1, 2, 3, 4):
        raise ValueError(f"ace stage must be 1, 2, 3 or 4 (E1-E4 of the paper's Table 4), got {stage!r}")
    check_choice("ace", "prior", prior, ("official", "mean_cov"))
    check_include_conv(include_conv)


def _regmean_check(reduce_non_diagonal_ratio):
    if not 0 <= reduce_non_diagonal_ratio <= 1:
        raise ValueError(f"regmean reduce_non_diagonal_ratio must be in [0, 1], got {reduce_non_diagonal_ratio}")


def _fisher_check(normalize_fisher_weight, minimal_fisher_weight, normalization):
    if not isinstance(normalize_fisher_weight, bool):
        raise ValueError(f"fisher normalize_fisher_weight must be true or false, got {normalize_fisher_weight!r}")
    if not minimal_fisher_weight >= 0:
        raise ValueError(f"fisher minimal_fisher_weight must be >= 0, got {minimal_fisher_weight}")
    check_choice("fisher", "normalization", normalization, ("ours", "reference"))


def _emr_check(rescale, zero_sign):
    check_choice("emr", "rescale", rescale, ("whole_vector", "per_tensor"))
    check_choice("emr", "zero_sign", zero_sign, ("none", "negative"))


# By operator; an operator absent here accepts any value of its defaults' kinds.
RANGES = {
    "ties": _ties_check, "dare": _dare_check, "pcb": _pcb_check, "wudi": _wudi_check, "tsv_m": _tsvm_check,
    "iso_c": _svd_check, "iso_cts": _iso_cts_check,
    "ace": _ace_check, "consensus_ta": _consensus_check, "tall_masks": _tall_check,
    "dts": _dts_check, "regmean": _regmean_check, "fisher": _fisher_check, "emr": _emr_check,
}


def check_hyperparameters(operator: str, hyperparameters: dict) -> dict:
    """`hyperparameters` completed with the operator's defaults, once each is known, of its default's kind and
    in its operator's range (ValueError naming it otherwise)."""
    if operator not in SPECS:
        raise ValueError(f"unknown merge operator {operator!r}; known operators: {', '.join(sorted(SPECS))}")
    defaults = SPECS[operator].defaults
    unknown = set(hyperparameters) - set(defaults)
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "none"
        raise ValueError(f"merge operator {operator!r} has no hyperparameter {sorted(unknown)}; allowed: {allowed}")
    for key, value in hyperparameters.items():
        _check_kind(operator, key, value, defaults[key])
    hyper = {**defaults, **hyperparameters}
    if operator in RANGES:
        RANGES[operator](**hyper)
    return hyper


def _kind(value) -> str | None:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return "a word" if isinstance(value, str) else None


def _check_kind(operator: str, key: str, value, default) -> None:
    """A hyperparameter must have its default's kind (a number where the default is one, a flag, a word), so
    that the range checks compare like with like instead of raising TypeError."""
    expected = _kind(default)
    if expected is not None and _kind(value) != expected:
        raise ValueError(f"merge operator {operator!r}: hyperparameter {key!r} must be {expected} (default "
                         f"{default!r}), got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) \
            and not value.is_integer():
        raise ValueError(f"merge operator {operator!r}: hyperparameter {key!r} must be a whole number (default "
                         f"{default!r}), got {value!r}")
