# What the study builds: the paper's tables where the grid holds their inputs, the figures, the answer page
# and its links, and the default target, which gathers the audits', mixtures' and noise study's too.

# Each paper table is built where the configured grid holds its inputs, and otherwise listed with the reason in
# tables/index.md (and the workflow's log) instead of failing the run.
# Table 5 needs its two-query rows; DPSAT's one-query rows join it when configured
ABLATION_METHODS = tuple(m for m, spec in METHODS.items() if spec.ablation_row and not spec.one_query)
ONE_QUERY_FLATNESS_METHODS = tuple(m for m, spec in METHODS.items() if spec.ablation_row and spec.one_query)
COMPARED_METHODS = (BASELINE, PROPOSED)


def _missing_methods(needed):
    return [m for m in needed if m not in config["methods"]]


def epsilon_sweep_scores():
    """Table 4's inputs: the tables operator's merged scores of naive DP and DP-Merging at every budget."""
    groups = [g for g in release_grid() + epsilon_sweep_grid() if g["method"] in COMPARED_METHODS]
    return [SCORES_MERGED.format(operator=TABLE_OPERATOR, **g) for g in groups]


def sensitivity_scores(parameter, backbone):
    eps = sensitivity_epsilon(parameter)
    method = SWEEPS[parameter]["method"]
    groups = [g for g in sensitivity_grid(parameter) if g["backbone"] == backbone]
    groups += [
        g
        for g in release_grid()
        if g["backbone"] == backbone and g["eps"] == eps and g["method"] in (method, "naive_dp")
    ]
    return [SCORES_MERGED.format(operator=TABLE_OPERATOR, **g) for g in groups]


def _sensitivity_values(parameter, backbone):
    """Distinct values of `parameter` the table would show: the sweep's and the main run's."""
    method = SWEEPS[parameter]["method"]
    values = {float(finetune_settings_of(backbone, method)[parameter])} if method in config["methods"] else set()
    values |= {
        sensitivity_override(g["method"])[parameter] for g in sensitivity_grid(parameter) if g["backbone"] == backbone
    }
    return values


def planned_tables():
    """({table prefix: (rule, wildcards)}, [(table, reason skipped)]) for the configured grid."""
    planned, skipped = {}, []
    for b in config["backbones"]:
        for e in PRIVATE_EPS:
            planned[TABLE1.format(backbone=b, eps=e)] = "table1"
            if not OPERATOR_NAMES:
                skipped.append((f"Tables 5 and 8, {b}, {e}", "no merges configured (the budget protocol)"))
                continue
            if missing := _missing_methods(ABLATION_METHODS):
                skipped.append((f"Table 5 (ablation), {b}, {e}", f"methods lack {', '.join(missing)}"))
            else:
                planned[TABLE5.format(backbone=b, eps=e)] = "table5"
            if missing := _missing_methods(COMPARED_METHODS):
                skipped.append((f"Table 8 (operators), {b}, {e}", f"methods lack {', '.join(missing)}"))
            else:
                planned[TABLE8.format(backbone=b, eps=e)] = "table8"
    groups = release_grid() + epsilon_sweep_grid()
    budgets = {
        b: set.intersection(
            *({g["eps"] for g in groups if g["backbone"] == b and g["method"] == m} for m in COMPARED_METHODS)
        )
        for b in config["backbones"]
    }
    if max(len(found) for found in budgets.values()) < 2:
        skipped.append(
            (
                "Table 4 (epsilon sweep)",
                "no backbone has naive_dp and dp_merging at two or more budgets; add epsilons or sweeps.epsilon",
            )
        )
    else:
        planned[TABLE4] = "table4"
    for parameter, prefix, name in (("rho", TABLE6, "Table 6 (rho)"), ("anchor_lambda", TABLE7, "Table 7 (lambda)")):
        for b in config["backbones"]:
            if parameter not in SWEEPS:
                skipped.append((f"{name}, {b}", f"no sweeps.{parameter} configured"))
            elif b not in _sweep_backbones(SWEEPS[parameter]):
                skipped.append((f"{name}, {b}", f"sweeps.{parameter}.backbones leaves {b} out"))
            elif len(_sensitivity_values(parameter, b)) < 2:
                skipped.append((f"{name}, {b}", f"fewer than two values of {parameter}"))
            else:
                planned[prefix.format(backbone=b)] = "table6" if parameter == "rho" else "table7"
    return planned, skipped


PLANNED_TABLES, SKIPPED_TABLES = planned_tables()


def answer_tables():
    """SETTING=PARQUET of every Table 1, for the answer page."""
    return {
        f"{b}, ε = {epsilon_of_label(e):g}": f"{TABLE1.format(backbone=b, eps=e)}.parquet"
        for b in config["backbones"]
        for e in PRIVATE_EPS
    }


def signal_check_scores():
    """Every individual score file of the main grid: each method's individual models at every budget."""
    return [SCORES_INDIVIDUAL.format(**g) for g in release_grid()]


def protocol_tables():
    """Candidate (configured backbone) -> its Table 1 Parquet at the protocol's budget."""
    return {b: f"{TABLE1.format(backbone=b, eps=PRIVATE_EPS[0])}.parquet" for b in config["backbones"]}


def protocol_candidates():
    """Each configured backbone is one candidate setting of the protocol: its kind, trainable blocks and the
    private methods' fine-tuning settings."""
    candidates = {}
    for b, entry in config["backbones"].items():
        settings = finetune_settings_of(b, "naive_dp")
        candidates[b] = {
            "kind": entry["kind"],
            "trainable_blocks": entry.get("trainable_blocks"),
            **{k: settings.get(k) for k in ("lr", "head_lr", "epochs", "batch_size")},
        }
    return candidates


def answer_links():
    tables = [f"{prefix}.html" for prefix in PLANNED_TABLES]
    audits = [f"{AUDIT_TABLE}.md" for _ in answer_audit_table()]  # workflow/rules/audit_common.smk
    figures = [f"{prefix}.png" for prefix in all_figures()]
    return tables + [f"{SIGNAL_CHECK}.md"] + figures + [LEDGER_REPORT] + audits


for _table, _reason in SKIPPED_TABLES:
    print(f"dpmerge: skipping {_table}: {_reason}", file=sys.stderr)


def landscape_groups(backbone, eps):
    methods = [m for m in config["diagnostics"]["landscape"]["methods"] if m in config["methods"]]
    return [dict(backbone=backbone, eps=eps, method=m, seed=seeds_of(backbone)[0]) for m in methods]


def landscape_files(wildcards):
    return [LANDSCAPE.format(**g) for g in landscape_groups(wildcards.backbone, wildcards.eps)]


def backbone_curvature(wildcards):
    return [CURVATURE.format(**g) for g in all_groups() if g["curvature"] and g["backbone"] == wildcards.backbone]


def backbone_drift(wildcards):
    return [DRIFT.format(**g) for g in all_groups() if g["curvature"] and g["backbone"] == wildcards.backbone]


def all_figures():
    figures = []
    if not DIAGNOSTICS:  # every figure here reads a diagnostic
        return figures
    for b in config["backbones"]:
        figures.append(FIGURE_GAP_BOUND.format(backbone=b))
        if any(METHODS[method_of(g["method"])].private for g in all_groups() if g["backbone"] == b):
            figures.append(FIGURE_SHARPNESS_DRIFT.format(backbone=b))  # its x axis is epsilon
        for e in PRIVATE_EPS:
            figures.append(FIGURE_INTERPOLATION.format(backbone=b, eps=e))
            if landscape_groups(b, e):
                figures.append(FIGURE_LANDSCAPE.format(backbone=b, eps=e))
    return figures


def all_targets():
    targets = [LEDGER_REPORT, TABLES_INDEX]
    targets += [f"{SIGNAL_CHECK}{ext}" for ext in (".parquet", ".md", ".tex")] if release_grid() else []
    targets += [PROTOCOL_CHOICE] if PROTOCOL else []
    targets += [ANSWER, ANSWER_RST] if OPERATOR_NAMES else []
    for g in all_groups():
        if g["merges"] and DIAGNOSTICS:
            targets.append(DRIFT.format(**g))
        if g["curvature"]:
            targets += [CURVATURE.format(**g), LINEARITY.format(**g)]
        targets += [SCORES_MERGED.format(operator=o, **g) for o in g["merges"]]
    for prefix in PLANNED_TABLES:
        targets += [prefix + ext for ext in TABLE_EXTENSIONS]
    for prefix in all_figures():
        targets += [prefix + ext for ext in FIGURE_EXTENSIONS]
    # audit_common, mix_common, noise_common, ace_common
    return targets + audit_targets() + mix_targets() + noise_targets() + ace_targets() + denoise_targets()
