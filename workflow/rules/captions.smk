# The paper tables' and figures' inputs, captions and titles, from the grid in grid.smk: the wildcards and the
# config as plain values for dpmerge/report/captions.py.


def _kind(backbone):
    return config["backbones"][backbone]["kind"]


# Captions and titles: the wildcards and the config as plain values for dpmerge/report/captions.py
def table1_caption(wildcards):
    pretrained = None
    if "pretrained_head" in config["methods"]:
        pretrained = "zeroshot" if BACKBONES[_kind(wildcards.backbone)].zeroshot_heads else "dp"
    return multitask_table_caption(
        backbone=wildcards.backbone,
        kind=_kind(wildcards.backbone),
        epsilon=epsilon_of_label(wildcards.eps),
        n_seeds=len(seeds_of(wildcards.backbone)),
        pretrained=pretrained,
    )


def table1_metric_flag(wildcards):
    """Language backbones name each task's metric in the header (the paper's GLUE Tables 3/11)."""
    return "--metric-in-header" if BACKBONES[_kind(wildcards.backbone)].modality == "text" else ""


def table4_caption(wildcards):
    return epsilon_sweep_table_caption(
        operator=TABLE_OPERATOR, n_seeds=sorted({len(seeds_of(b)) for b in config["backbones"]})
    )


def table5_caption(wildcards):
    return ablation_table_caption(
        backbone=wildcards.backbone,
        kind=_kind(wildcards.backbone),
        epsilon=epsilon_of_label(wildcards.eps),
        n_seeds=len(seeds_of(wildcards.backbone)),
        one_query=[m for m in ONE_QUERY_FLATNESS_METHODS if m in config["methods"]],
    )


def sensitivity_caption(parameter):
    def caption(wildcards):
        return sensitivity_table_caption(
            parameter=parameter,
            method=SWEEPS[parameter]["method"],
            operator=TABLE_OPERATOR,
            backbone=wildcards.backbone,
            kind=_kind(wildcards.backbone),
            epsilon=epsilon_of_label(sensitivity_epsilon(parameter)),
            n_seeds=len(seeds_of(wildcards.backbone)),
        )

    return caption


def table8_caption(wildcards):
    return operators_table_caption(
        backbone=wildcards.backbone,
        kind=_kind(wildcards.backbone),
        epsilon=epsilon_of_label(wildcards.eps),
        n_seeds=len(seeds_of(wildcards.backbone)),
    )


def table5_scores(wildcards):
    groups = [g for g in table_groups(wildcards) if g["method"] in ABLATION_METHODS + ONE_QUERY_FLATNESS_METHODS]
    files = [SCORES_INDIVIDUAL.format(**g) for g in groups]
    return files + [SCORES_MERGED.format(operator=o, **g) for g in groups for o in OPERATOR_NAMES]


def table8_scores(wildcards):
    groups = [g for g in table_groups(wildcards) if g["method"] in COMPARED_METHODS]
    return [SCORES_MERGED.format(operator=o, **g) for g in groups for o in OPERATOR_NAMES]


def table6_scores(wildcards):
    return sensitivity_scores("rho", wildcards.backbone)


def table7_scores(wildcards):
    return sensitivity_scores("anchor_lambda", wildcards.backbone)


def interpolation_title(wildcards):
    return interpolation_figure_title(
        backbone=wildcards.backbone,
        epsilon=epsilon_of_label(wildcards.eps),
        operator=config["diagnostics"]["interpolation"]["operator"],
    )


def sharpness_drift_title(wildcards):
    return sharpness_drift_figure_title(backbone=wildcards.backbone, kind=_kind(wildcards.backbone))


def gap_bound_title(wildcards):
    return gap_bound_figure_title(backbone=wildcards.backbone, operator=config["diagnostics"]["curvature"]["operator"])


def landscape_title(wildcards):
    return landscape_figure_title(
        backbone=wildcards.backbone,
        epsilon=epsilon_of_label(wildcards.eps),
        operator=config["diagnostics"]["landscape"]["operator"],
    )


def tables_index_text():
    lines = ["# Paper tables of this run", "", "Built (each as .parquet, .md, .tex, .html):", ""]
    lines += [f"- {os.path.relpath(prefix, RESULTS)}" for prefix in PLANNED_TABLES]
    lines += ["", "Skipped, because the configured grid lacks their inputs:", ""]
    lines += [f"- {table}: {reason}" for table, reason in SKIPPED_TABLES] or ["- none"]
    return "\n".join(lines) + "\n"
