# The mixtures' paths and input functions (rules in workflow/rules/mix.smk): releases at target epsilons
# without training (config mix:, dpmerge mix). The mixtures are alternatives to the trained releases, not more
# releases: the ledger composes what the study releases, and each mixture's epsilon is recomputed by the table.

from dpmerge.config_check import released_budgets

MIX = config["mix"]
MIX_TV = result("mixtures/taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
MIX_HEAD = result("mixtures/heads/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
MIX_MERGED = result("mixtures/merged/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
MIX_SCORES = result("mixtures/scores/{backbone}/{eps}/{method}/{seed}/{operator}.parquet")
# Linear combinations (config mix.combine, dpmerge combine): the average of `copies` independent repetitions at
# one budget, chunk j of the seeds filed under the j-th seed (the trained run it is paired with).
COMBINED_TV = result("mixtures/combined/taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
COMBINED_HEAD = result("mixtures/combined/heads/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
COMBINED_MERGED = result("mixtures/combined/merged/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
COMBINED_SCORES = result("mixtures/combined/scores/{backbone}/{eps}/{method}/{seed}/{operator}.parquet")
MIX_TABLE = result("tables/mixing")
FIGURE_MIX = result("figures/mixing")


def mix_groups():
    """(backbone, eps, method, seed) of every mixed release group: each target, method and seed."""
    return [
        dict(backbone=b, eps=eps_label(t), method=m, seed=s)
        for b in config["backbones"]
        for m in MIX["methods"]
        for t in MIX["targets"]
        for s in seeds_of(b)
    ]


def mix_component_labels(wildcards):
    """The budgets a mixture selects among: every budget the method is released at on the backbone but the target."""
    return [
        eps_label(e)
        for e in released_budgets(config, wildcards.backbone, wildcards.method)
        if eps_label(e) != wildcards.eps
    ]


def mix_components(pattern):
    def inputs(wildcards):
        return [pattern.format(**dict(wildcards, eps=e)) for e in mix_component_labels(wildcards)]

    return inputs


def combine_groups():
    """(backbone, eps, method, seed) of every combination: per backbone and method, one per chunk of `copies`
    seeds, filed under the chunk's index into the seeds (none while copies is 0)."""
    combine = MIX["combine"]
    copies = combine["copies"]
    if not (MIX["targets"] and copies):
        return []
    return [
        dict(backbone=b, eps=eps_label(combine["target"]), method=m, seed=seeds_of(b)[j])
        for b in config["backbones"]
        for m in MIX["methods"]
        for j in range(len(seeds_of(b)) // copies)
    ]


def combined_components(pattern):
    """The `copies` releases at combine.budget that chunk `seed` averages (the seeds after the chunk's index)."""

    def inputs(wildcards):
        seeds = seeds_of(wildcards.backbone)
        copies, start = MIX["combine"]["copies"], seeds.index(wildcards.seed) * MIX["combine"]["copies"]
        budget = eps_label(MIX["combine"]["budget"])
        return [pattern.format(**dict(wildcards, eps=budget, seed=s)) for s in seeds[start : start + copies]]

    return inputs


def mix_trained_scores():
    """The trained releases' merged scores the table compares with: every released budget of each mixed method."""
    groups = [g for g in release_grid() + epsilon_sweep_grid() if g["method"] in MIX["methods"]]
    return [SCORES_MERGED.format(operator=MIX["operator"], **g) for g in groups]


def mix_targets():
    if not MIX["targets"]:
        return []
    return [MIX_TABLE + ext for ext in (".parquet", ".md", ".tex")] + [FIGURE_MIX + ext for ext in FIGURE_EXTENSIONS]
