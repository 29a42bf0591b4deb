# Releases at target epsilons without training (paths and inputs in workflow/rules/mix_common.smk): per task,
# one of a method's releases at the other budgets, drawn with probabilities that meet the target; the mixed
# task vectors merged and scored beside the releases trained at those budgets; and per chunk of seeds, the
# average of that many independent releases at one budget (a linear combination at their composed epsilon).


rule mix:
    input:
        vectors=mix_components(TV),
        heads=mix_components(HEAD),
    output:
        vector=MIX_TV,
        head=MIX_HEAD,
    params:
        target=lambda wildcards: epsilon_of_label(wildcards.eps),
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
        f"{GPU_JOB}"
        "(dpmerge merge {params.hyper} --require-privacy-record --base {input.base} -o {output.merged} "
        "{input.vectors} && "
        "dpmerge evaluate --backbone-spec {params.spec:q} --base {input.base} --merged {output.merged} "
        "--heads {input.heads} --data {input.data} --threads {threads} -o {output.scores}) > {log} 2>&1"


rule combine:
    input:
        vectors=combined_components(TV),
        heads=combined_components(HEAD),
    output:
        vector=COMBINED_TV,
        head=COMBINED_HEAD,
    params:
        target=lambda wildcards: epsilon_of_label(wildcards.eps),
        seed=lambda wildcards: wildcards.seed[1:],
    log:
        result("logs/combine/{backbone}/{eps}/{method}/{seed}/{task}.log"),
    benchmark:
        result("benchmarks/combine/{backbone}/{eps}/{method}/{seed}/{task}.tsv")
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime="10m",
    shell:
        "dpmerge combine --task-vectors {input.vectors} --heads {input.heads} --target-epsilon {params.target} "
        "--seed {params.seed} --out-vector {output.vector} --out-head {output.head} "
        f"--release-log {RELEASE_LOG} > {{log}} 2>&1"


use rule mix_merge as combine_merge with:
    input:
        base=PRETRAINED,
        vectors=per_task(COMBINED_TV),
        heads=per_task(COMBINED_HEAD),
        data=per_task(DATA),
    output:
        merged=COMBINED_MERGED,
        scores=COMBINED_SCORES,
    log:
        result("logs/combine_merge/{backbone}/{eps}/{method}/{seed}/{operator}.log"),
    benchmark:
        result("benchmarks/combine_merge/{backbone}/{eps}/{method}/{seed}/{operator}.tsv")


rule mix_report:
    input:
        mixed=[MIX_SCORES.format(operator=MIX["operator"], **g) for g in mix_groups()],
        vectors=[MIX_TV.format(task=t, **g) for g in mix_groups() for t in config["backbones"][g["backbone"]]["tasks"]],
        combined=[COMBINED_SCORES.format(operator=MIX["operator"], **g) for g in combine_groups()],
        combined_vectors=[
            COMBINED_TV.format(task=t, **g)
            for g in combine_groups()
            for t in config["backbones"][g["backbone"]]["tasks"]
        ],
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
        "--combined {input.combined} --combined-vectors {input.combined_vectors} "
        f"--out-prefix {MIX_TABLE} "
        "--figure {output.png} {output.pdf} > {log} 2>&1"
