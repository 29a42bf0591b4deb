# The study's release groups: the main grid (backbone x budget x method x seed), the sweeps, the noise-scale
# study's extra groups (workflow/rules/noise_common.smk), the merges each runs and which are diagnosed.

SWEEPS = config["sweeps"]
TABLE_OPERATOR = config["tables"]["operator"]


# The model diagnostics (curvature, linearity, interpolation) are the DAG's slowest jobs; a study may run them
# on its first seeds only (drift then runs on every seed), or not at all (seeds: 0, the demo's answer needs none
# of them: no drift either, and none of the figures that read them).
_DIAGNOSED = config["diagnostics"].get("seeds")
DIAGNOSTICS = bool(OPERATOR_NAMES) and _DIAGNOSED != 0


def diagnosed(group):
    """Whether the model diagnostics run on a release group: on its backbone's first `diagnostics.seeds` seeds."""
    if not DIAGNOSTICS:
        return False
    seeds = seeds_of(group["backbone"])
    return group["seed"] in (seeds if _DIAGNOSED is None else seeds[:_DIAGNOSED])


# The training-budget protocol (presets/protocol.yaml): individual models scored on a validation split held out
# of each task's training data, no merges, and the choice of budget (rule select_budget).
PROTOCOL = bool(config["data"].get("validation_fraction"))


def release_grid():
    """(backbone, eps, method, seed) of every release group of the main grid: every merge, every diagnostic."""
    return [
        dict(backbone=b, eps=e, method=m, seed=s)
        for b in config["backbones"]
        for m in config["methods"]
        for e in eps_labels_for(m)
        for s in seeds_of(b)
    ]


def _sweep_backbones(sweep):
    return sweep.get("backbones") or list(config["backbones"])


def epsilon_sweep_grid():
    """Release groups the epsilon sweep adds (Table 4, Fig. 3): its budgets not already in the main grid."""
    sweep = SWEEPS.get("epsilon")
    if not sweep:
        return []
    return [
        dict(backbone=b, eps=eps_label(e), method=m, seed=s)
        for b in _sweep_backbones(sweep)
        for m in sweep["methods"]
        for e in sweep["epsilons"]
        if eps_label(e) not in PRIVATE_EPS
        for s in seeds_of(b)
    ]


def sensitivity_epsilon(parameter):
    return eps_label(SWEEPS[parameter].get("epsilon", config["epsilons"][0]))


def sensitivity_grid(parameter):
    """Release groups of one sensitivity sweep (Table 6: rho, Table 7: anchor_lambda). A value equal to the
    method's configured setting is the main grid's run and is not repeated."""
    sweep = SWEEPS.get(parameter)
    if not sweep:
        return []
    method = sweep["method"]
    groups = []
    for b in _sweep_backbones(sweep):
        default = finetune_settings_of(b, method)[parameter]
        for value in sweep["values"]:
            if float(value) == float(default):
                continue
            label = sweep_label(method, parameter, value)
            groups += [dict(backbone=b, eps=sensitivity_epsilon(parameter), method=label, seed=s) for s in seeds_of(b)]
    return groups


def sweep_merges(parameter):
    """Merges a sweep's groups run: its operators, the tables' operator, and (epsilon sweep) the curvature
    diagnostic's, whose merge gap needs that merge."""
    names = list(SWEEPS[parameter].get("operators", [])) + [TABLE_OPERATOR]
    if parameter == "epsilon":
        names.append(config["diagnostics"]["curvature"]["operator"])
    return list(dict.fromkeys(names))


def all_groups():
    """Every release group with the merges it runs and whether the curvature diagnostic runs on it."""
    groups = [
        dict(g, merges=OPERATOR_NAMES, curvature=diagnosed(g)) for g in release_grid() if not head_only(g["method"])
    ]
    # The Pretrained row's runs (w0 + a DP head): their task vectors are zero, so there is nothing to merge or
    # diagnose; only their individual scores are read
    groups += [dict(g, merges=[], curvature=False) for g in release_grid() if head_only(g["method"])]
    groups += [dict(g, merges=sweep_merges("epsilon"), curvature=diagnosed(g)) for g in epsilon_sweep_grid()]
    for parameter in SENSITIVITY_LABELS:
        groups += [dict(g, merges=sweep_merges(parameter), curvature=False) for g in sensitivity_grid(parameter)]
    return groups + noise_extra_groups(groups)  # workflow/rules/noise_common.smk


def head_only(method):
    return METHODS[method_of(method)].head_only


def all_task_vectors():
    return [TV.format(task=t, **g) for g in all_groups() for t in config["backbones"][g["backbone"]]["tasks"]]


def table_groups(wildcards):
    """Release groups shown for one (backbone, eps): that epsilon's, plus the non-private reference if run."""
    return [
        g
        for g in release_grid()
        if g["backbone"] == wildcards.backbone and g["eps"] in (wildcards.eps, NONPRIVATE_LABEL)
    ]


def table_scores(wildcards):
    """Every score file a (backbone, eps) table reads: individual and merged, all methods and seeds."""
    groups = table_groups(wildcards)
    files = [SCORES_INDIVIDUAL.format(**g) for g in groups]
    files += [
        SCORES_MERGED.format(operator=o, **g) for g in groups for o in OPERATOR_NAMES if not head_only(g["method"])
    ]
    return files


def table_curves(wildcards):
    return [INTERPOLATION.format(**g) for g in table_groups(wildcards) if diagnosed(g) and not head_only(g["method"])]
