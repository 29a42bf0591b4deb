# Releases at target epsilons without training (config mix:, dpmerge mix): per task, one of a method's releases
# at the other budgets, drawn with probabilities that meet the target; the mixed task vectors merged and scored
# beside the releases trained at those budgets. The mixtures are alternatives to the trained releases, not more
# releases: the ledger composes what the study releases, and each mixture's epsilon is recomputed by the table.

from dpmerge.config_check import released_budgets

MIX = config["mix"]
MIX_TV = result("mixtures/taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
MIX_HEAD = result("mixtures/heads/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
MIX_MERGED = result("mixtures/merged/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
MIX_SCORES = result("mixtures/scores/{backbone}/{eps}/{method}/{seed}/{operator}.parquet")
MIX_TABLE = result("tables/mixing")
FIGURE_MIX = result("figures/mixing")


def mix_groups():
    """(backbone, eps, method, seed) of every mixed release group: each target, method and seed."""
    return [
        dict(backbone=b, eps=eps_label(t), method=m, seed=s)
        for b in config["backbones"]
        for m in MIX["methods"]
        for t in MIX["targets"]
        for s in SEEDS
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


def mix_trained_scores():
    """The trained releases' merged scores the table compares with: every released budget of each mixed method."""
    groups = [g for g in release_grid() + epsilon_sweep_grid() if g["method"] in MIX["methods"]]
    return [SCORES_MERGED.format(operator=MIX["operator"], **g) for g in groups]


def mix_targets():
    if not MIX["targets"]:
        return []
    return [MIX_TABLE + ext for ext in (".parquet", ".md", ".tex")] + [FIGURE_MIX + ext for ext in FIGURE_EXTENSIONS]


rule mix:
    input:
        vectors=mix_components(TV),
        heads=mix_components(HEAD),
    output:
        vector=MIX_TV,
        head=MIX_HEAD,
    params:
        target=lambda wildcards: eps_value(wildcards.eps),
        rng=config["privacy"]["rng"],
    log:
        result("logs/mix/{backbone}/{eps}/{method}/{seed}/{task}.log"),
    benchmark:
        result("benchmarks/mix/{backbone}/{eps}/{method}/{seed}/{task}.tsv")
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime="10m",
    shell:
        "dpmerge mix --task-vectors {input.vectors} --heads {input.heads} --target-epsilon {params.target} "
        f"--study-key {STUDY_KEY} "
        "--rng {params.rng} --out-vector {output.vector} --out-head {output.head} > {log} 2>&1"


rule mix_merge:
    input:
        base=PRETRAINED,
        vectors=per_task(MIX_TV),
        heads=per_task(MIX_HEAD),
        data=per_task(DATA),
    output:
        merged=MIX_MERGED,
        scores=MIX_SCORES,
    params:
        hyper=operator_params,
        spec=backbone_spec,
    log:
        result("logs/mix_merge/{backbone}/{eps}/{method}/{seed}/{operator}.log"),
    benchmark:
        result("benchmarks/mix_merge/{backbone}/{eps}/{method}/{seed}/{operator}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        "(dpmerge merge {params.hyper} --require-privacy-record --base {input.base} -o {output.merged} "
        "{input.vectors} && "
        "dpmerge evaluate --backbone-spec {params.spec:q} --base {input.base} --merged {output.merged} "
        "--heads {input.heads} --data {input.data} --threads {threads} -o {output.scores}) > {log} 2>&1"


rule mix_report:
    input:
        mixed=[MIX_SCORES.format(operator=MIX["operator"], **g) for g in mix_groups()],
        vectors=[MIX_TV.format(task=t, **g) for g in mix_groups() for t in config["backbones"][g["backbone"]]["tasks"]],
        trained=mix_trained_scores(),
    output:
        parquet=f"{MIX_TABLE}.parquet",
        markdown=report(
            f"{MIX_TABLE}.md",
            caption="../report/table_mixing.rst",
            category="Privacy",
            labels={"file": "mixing table"},
        ),
        tex=f"{MIX_TABLE}.tex",
        png=report(
            f"{FIGURE_MIX}.png",
            caption="../report/figure_mixing.rst",
            category="Privacy",
            labels={"file": "mixing figure"},
        ),
        pdf=f"{FIGURE_MIX}.pdf",
    log:
        result("logs/mix_report.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge mix-report --mixed {input.mixed} --vectors {input.vectors} --trained {input.trained} "
        f"--out-prefix {MIX_TABLE} "
        "--figure {output.png} {output.pdf} > {log} 2>&1"
