# Denoised releases (inputs and grid in workflow/rules/denoise_common.smk): each release denoised from the vector
# alone, for the merges that ask for it; then the study's tables and figure.


rule denoise:
    input:
        TV,
    output:
        DENOISED_TV,
    log:
        result("logs/denoise/{denoiser}/{backbone}/{eps}/{method}/{seed}/{task}.log"),
    benchmark:
        result("benchmarks/denoise/{denoiser}/{backbone}/{eps}/{method}/{seed}/{task}.tsv")
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        runtime="30m",
    shell:
        "dpmerge denoise --task-vector {input} --method {wildcards.denoiser} -o {output} > {log} 2>&1"


rule denoise_report:
    input:
        scores=[
            SCORES_MERGED.format(operator=o, **g)
            for g in denoise_study_groups()
            for name in DENOISE_STUDY["operators"]
            for o in (name, denoised_counterpart(config, name))
        ],
        pretrained=denoise_study_pretrained(),
        vectors=denoise_study_vectors(),
    output:
        scores=report(
            f"{DENOISE_TABLE}.md",
            caption="../report/table_denoise.rst",
            category="Denoised releases",
            labels={"file": "denoised releases merged"},
        ),
        scores_parquet=f"{DENOISE_TABLE}.parquet",
        scores_tex=f"{DENOISE_TABLE}.tex",
        noise=report(
            f"{DENOISE_TABLE}_noise.md",
            caption="../report/table_denoise_noise.rst",
            category="Denoised releases",
            labels={"file": "what denoising found"},
        ),
        noise_parquet=f"{DENOISE_TABLE}_noise.parquet",
        noise_tex=f"{DENOISE_TABLE}_noise.tex",
        png=report(
            f"{FIGURE_DENOISE}.png",
            caption="../report/figure_denoise.rst",
            category="Denoised releases",
            labels={"file": "denoised releases figure"},
        ),
        pdf=f"{FIGURE_DENOISE}.pdf",
    params:
        pairs=denoise_pairs(),
    log:
        result("logs/denoise_report.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge denoise-report --scores {input.scores} --pretrained {input.pretrained} --vectors {input.vectors} "
        f"--pairs {{params.pairs}} --out-prefix {DENOISE_TABLE} --figure {{output.png}} {{output.pdf}} > {{log}} 2>&1"
