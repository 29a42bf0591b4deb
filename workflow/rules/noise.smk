# The effective noise scale of mergeability (grid and paths in workflow/rules/noise_common.smk): every group's T
# beside its merge success, then one table and figure.


rule noise_scale:
    input:
        base=PRETRAINED,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
        individual=SCORES_INDIVIDUAL,
        merged=noise_merged_scores,
        interpolation=INTERPOLATION,
    output:
        NOISE_ROWS,
    params:
        spec=backbone_spec,
        sweep=noise_sweep,
        max_examples=NOISE["max_examples"],
    log:
        result("logs/noise_scale/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/noise_scale/{backbone}/{eps}/{method}/{seed}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        f"{GPU_JOB}"
        "dpmerge noise-scale --backbone-spec {params.spec:q} --base {input.base} --task-vectors {input.vectors} "
        "--heads {input.heads} --data {input.data} --individual {input.individual} --merged {input.merged} "
        "--interpolation {input.interpolation} --label {wildcards.method} --sweep {params.sweep} "
        "--max-examples {params.max_examples} -o {output} > {log} 2>&1"


rule noise_report:
    input:
        rows=[NOISE_ROWS.format(**g) for g in noise_groups()],
    output:
        parquet=f"{NOISE_TABLE}.parquet",
        markdown=report(
            f"{NOISE_TABLE}.md",
            caption="../report/table_noise_scale.rst",
            category="Effective noise",
            labels={"file": "effective-noise table"},
        ),
        tex=f"{NOISE_TABLE}.tex",
        readings_parquet=f"{NOISE_TABLE}_readings.parquet",
        readings=report(
            f"{NOISE_TABLE}_readings.md",
            caption="../report/table_noise_readings.rst",
            category="Effective noise",
            labels={"file": "effective-noise readings"},
        ),
        readings_tex=f"{NOISE_TABLE}_readings.tex",
        png=report(
            f"{FIGURE_NOISE}.png",
            caption="../report/figure_noise_scale.rst",
            category="Effective noise",
            labels={"file": "effective-noise figure"},
        ),
        pdf=f"{FIGURE_NOISE}.pdf",
    log:
        result("logs/noise_report.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        f"dpmerge noise-report --rows {{input.rows}} --out-prefix {NOISE_TABLE} "
        "--figure {output.png} {output.pdf} > {log} 2>&1"
