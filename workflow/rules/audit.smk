# One-run privacy audits (dpmerge audit, config `audit:`): per audited (backbone, eps, method, seed, task, kind)
# the release's mechanism once more with canaries, per group its merged models, per (backbone, eps, method,
# kind) one audit pooling them all, then one table and figure.
# Paths and input functions: workflow/rules/audit_common.smk.


rule audit:
    input:
        data=DATA,
        zeroshot=zeroshot_head_input,
    output:
        row=AUDIT_ROW,
        run=AUDIT_RUN,
    params:
        spec=backbone_spec,
        hparams=finetune_hparams,
        epsilon=epsilon_argument,
        seed=seed_number,
        canaries=lambda wildcards: AUDIT["canaries"][wildcards.kind],
        delta=AUDIT["delta"],
        confidence=AUDIT["confidence"],
        groups=audit_group_flags,
    log:
        result("logs/audit/{backbone}/{eps}/{method}/{seed}/{task}.{kind}.log"),
    benchmark:
        result("benchmarks/audit/{backbone}/{eps}/{method}/{seed}/{task}.{kind}.tsv")
    wildcard_constraints:
        kind="white_box|black_box",
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 6000),
        runtime=backbone_resource("runtime", "12h"),
        gpu=gpus,
        # not a setting of the release: a resource, so changing it reruns nothing (finetune.smk)
        replace_release="yes" if config["privacy"]["replace_releases"] else "no",
    shell:
        f"{GPU_JOB}"
        "dpmerge audit --backbone {wildcards.backbone} --backbone-spec {params.spec:q} "
        "--data {input.data} --zeroshot-head {input.zeroshot} --method {wildcards.method} {params.epsilon} "
        "--seed {params.seed} --hparams {params.hparams:q} --kind {wildcards.kind} --canaries {params.canaries} "
        "--audit-delta {params.delta} --confidence {params.confidence} {params.groups} "
        f"--study-key {STUDY_KEY} "
        "--threads {threads} --keep-run {output.run} --replace-release {resources.replace_release} "
        "-o {output.row} > {log} 2>&1"


rule audit_merge:
    input:
        runs=per_task(AUDIT_RUN),
    output:
        row=AUDIT_MERGED,
        scores=AUDIT_MERGED_SCORES,
    params:
        spec=backbone_spec,
        operator=audit_operator_params,
    log:
        result("logs/audit_merge/{backbone}/{eps}/{method}/{seed}/{operator}.{kind}.log"),
    wildcard_constraints:
        kind="white_box|black_box",
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        runtime="1h",
    shell:
        "dpmerge audit-merge {input.runs} {params.operator} --backbone-spec {params.spec:q} "
        "--threads {threads} --keep-scores {output.scores} -o {output.row} > {log} 2>&1"


rule audit_pool:
    input:
        runs=pooled_audit_runs,
        merged=pooled_merged_scores,
    output:
        AUDIT_POOLED,
    log:
        result("logs/audit_pool/{backbone}/{eps}/{method}.{kind}.log"),
    wildcard_constraints:
        kind="white_box|black_box",
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge audit-pool {input.runs} --merged {input.merged} -o {output} > {log} 2>&1"


rule audit_report:
    input:
        all_audit_rows(),
    output:
        parquet=f"{AUDIT_TABLE}.parquet",
        markdown=report(
            f"{AUDIT_TABLE}.md",
            caption="../report/table_audit.rst",
            category="Privacy",
            labels={"file": "audit table"},
        ),
        tex=f"{AUDIT_TABLE}.tex",
        png=report(
            f"{FIGURE_AUDIT}.png",
            caption="../report/figure_audit.rst",
            category="Privacy",
            labels={"file": "audit figure"},
        ),
        pdf=f"{FIGURE_AUDIT}.pdf",
    log:
        result("logs/audit_report.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        f"dpmerge audit-report {{input}} --out-prefix {AUDIT_TABLE} " "--figure {output.png} {output.pdf} > {log} 2>&1"
