# The merges' input functions (rules in workflow/rules/merge.smk): each operator's flags, and the RegMean or
# Fisher statistics it reads, public or private.


def operator_params(wildcards):
    """The merge's operator, vectors, hyperparameters and statistics file as flags (a change reruns only this
    merge onwards)."""
    name = wildcards.operator
    flags = [
        f"--method {operator_of(name)}",
        f"--vectors {config['merge'][name].get('vectors', 'task')}",
        f"--name {name}",
    ]
    flags += [f"--param {key}={json.dumps(value)}" for key, value in sorted(hyperparameters_of(name).items())]
    flags += [f"--statistics {path}" for path in merge_statistics_files(wildcards)]
    return " ".join(flags)


def merge_vectors(wildcards):
    """The task vectors a merge reads: the releases, or their denoised versions where the entry has `denoise`."""
    denoiser = config["merge"][wildcards.operator].get("denoise")
    pattern = TV if denoiser is None else DENOISED_TV
    return [pattern.format(task=task, denoiser=denoiser, **wildcards) for task in tasks_of(wildcards)]


def merge_statistics_files(wildcards):
    """The statistics a merge reads (RegMean, Fisher), or none."""
    if operator_of(wildcards.operator) not in NEEDS_STATISTICS:
        return []
    return [STATISTICS.format(**wildcards)]


def statistics_params(wildcards):
    name = wildcards.operator
    settings = config["merge"][name]["statistics"]
    flags = [
        f"--kind {NEEDS_STATISTICS[operator_of(name)]}",
        f"--source {settings['data']}",
        f"--examples {settings.get('examples', 256)}",
    ]
    if settings["data"] == "private":
        flags += [f"--clip-norm {settings['clip_norm']}", f"--epsilon {settings['epsilon']}"]
    return " ".join(flags)


def public_data_input(wildcards):
    """The prepared dataset a backbone declares public, for merges whose statistics read public data."""
    if config["merge"][wildcards.operator]["statistics"]["data"] != "public":
        return []
    return [DATA.format(backbone=wildcards.backbone, task=config["backbones"][wildcards.backbone]["public_data"])]


def public_data_flag(wildcards, input):
    return f"--public-data {input.public}" if input.public else ""


def all_statistics():
    return [
        STATISTICS.format(operator=name, **g)
        for g in all_groups()
        for name in g["merges"]
        if operator_of(name) in NEEDS_STATISTICS
    ]


# The main grid's release groups are scored in one job each (merge_group in merge.smk): individual models and
# every merge that reads nothing but the releases (no data statistics, no denoised vectors). A group of the sweeps, a
# merge with statistics and a merge a diagnostic reads keep the per-file rules merge and evaluate_individual: a
# group job rewrites all its files when any of its merges changes, which must not rerun the diagnostics.
DIAGNOSED_MERGES = (
    {config["diagnostics"][name]["operator"] for name in ("interpolation", "curvature", "landscape")}
    if DIAGNOSTICS
    else set()
)


def _group_merge(name):
    entry = config["merge"][name]
    return operator_of(name) not in NEEDS_STATISTICS and not entry.get("denoise") and name not in DIAGNOSED_MERGES


GROUP_MERGES = [name for name in OPERATOR_NAMES if _group_merge(name)]
GROUP_METHODS = [m for m in config["methods"] if not head_only(m)]


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)"


GROUP_CONSTRAINTS = dict(
    eps=_alternatives({e for m in GROUP_METHODS for e in eps_labels_for(m)}),
    method=_alternatives(GROUP_METHODS),
    seed=_alternatives(ALL_SEEDS),
)


def group_merges_json(wildcards):
    """The group job's merges as 'dpmerge score-group --merges' reads them (a change reruns the group's job)."""
    return json.dumps(
        {
            name: {
                "method": operator_of(name),
                "vectors": config["merge"][name].get("vectors", "task"),
                "params": hyperparameters_of(name),
            }
            for name in GROUP_MERGES
        },
        sort_keys=True,
    )


def group_merge_files(output):
    """--merged and --scores as NAME=PATH, in GROUP_MERGES' order (the order of the rule's output lists); none
    without merges."""
    if not GROUP_MERGES:
        return ""
    merged = " ".join(f"{name}={path}" for name, path in zip(GROUP_MERGES, output.merged))
    scores = " ".join(f"{name}={path}" for name, path in zip(GROUP_MERGES, output.scores))
    return f"--merged {merged} --scores {scores}"
