# The effective-noise study's grid, paths and input functions (rules in workflow/rules/noise.smk): each configured
# method fine-tuned again with one of lr, expected batch size, weight decay or epsilon changed (config noise_scale:,
# diagnostics/noise_scale.py). Its release groups are ordinary releases: the ledger composes them with the rest.

NOISE = config["noise_scale"]
NOISE_ROWS = result("noise_scale/{backbone}/{eps}/{method}/{seed}.parquet")
NOISE_TABLE = result("tables/noise_scale")
FIGURE_NOISE = result("figures/noise_scale")


def noise_groups():
    """(backbone, eps, method label, seed, sweep) of every group the study reads: the configured run and one
    group per changed value."""
    groups = []
    for b in NOISE["backbones"] or config["backbones"]:
        for m in NOISE["methods"]:
            private = METHODS[m].private
            centre = PRIVATE_EPS[0] if private else NONPRIVATE_LABEL
            settings = finetune_settings_of(b, m)
            varied = [(m, centre, "centre")]
            varied += [(sweep_label(m, "lr", f * float(settings["lr"])), centre, "lr") for f in NOISE["lr_factors"]]
            for parameter, values in (("batch_size", NOISE["batch_sizes"]), ("weight_decay", NOISE["weight_decays"])):
                varied += [
                    (sweep_label(m, parameter, v), centre, parameter)
                    for v in values
                    if float(v) != float(settings[parameter])
                ]
            if private:
                varied += [(m, eps_label(e), "epsilon") for e in NOISE["epsilons"] if eps_label(e) != centre]
            groups += [
                dict(backbone=b, eps=e, method=label, seed=s, sweep=sweep)
                for label, e, sweep in varied
                for s in seeds_of(b)[: NOISE["seeds"]]
            ]
    return groups


def noise_extra_groups(existing):
    """The study's groups the rest of the grid does not already run, with the merges it reads (all_groups)."""
    have = {(g["backbone"], g["eps"], g["method"], g["seed"]) for g in existing}
    merges = list(dict.fromkeys([NOISE["operator"], config["diagnostics"]["interpolation"]["operator"]]))
    return [
        dict(backbone=g["backbone"], eps=g["eps"], method=g["method"], seed=g["seed"], merges=merges, curvature=False)
        for g in noise_groups()
        if (g["backbone"], g["eps"], g["method"], g["seed"]) not in have
    ]


def noise_sweep(wildcards):
    key = (wildcards.backbone, wildcards.eps, wildcards.method, wildcards.seed)
    for g in noise_groups():
        if (g["backbone"], g["eps"], g["method"], g["seed"]) == key:
            return g["sweep"]
    raise ValueError(f"{key} is not a group of the effective-noise study (noise_scale:)")


def noise_merged_scores(wildcards):
    return SCORES_MERGED.format(operator=NOISE["operator"], **wildcards)


def noise_targets():
    if not NOISE["methods"]:
        return []
    tables = [NOISE_TABLE, NOISE_TABLE + "_readings"]
    return [table + ext for table in tables for ext in (".parquet", ".md", ".tex")] + [
        FIGURE_NOISE + ext for ext in FIGURE_EXTENSIONS
    ]
