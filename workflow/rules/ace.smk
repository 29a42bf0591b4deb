# ACE-Merging under DP (grid and paths in workflow/rules/ace_common.smk): its gate and noise floor per release
# group, then the study's tables and figure.


rule ace_gates:
    input:
        vectors=per_task(TV),
    output:
        ACE_GATES,
    params:
        threshold=ACE["gamma_threshold"],
    log:
        result("logs/ace_gates/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/ace_gates/{backbone}/{eps}/{method}/{seed}.tsv")
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        runtime="30m",
    shell:
        "dpmerge ace-gates --task-vectors {input.vectors} --gamma-threshold {params.threshold} -o {output} "
        "> {log} 2>&1"


rule ace_report:
    input:
        gates=[ACE_GATES.format(**g) for g in ace_groups()],
        scores=[SCORES_MERGED.format(operator=o, **g) for g in ace_groups() for o in ACE["operators"]],
    output:
        gates=report(
            f"{ACE_TABLE}_gates.md",
            caption="../report/table_ace_gates.rst",
            category="ACE under DP",
            labels={"file": "ACE's gate and noise floor"},
        ),
        gates_parquet=f"{ACE_TABLE}_gates.parquet",
        gates_tex=f"{ACE_TABLE}_gates.tex",
        scores=report(
            f"{ACE_TABLE}_scores.md",
            caption="../report/table_ace_scores.rst",
            category="ACE under DP",
            labels={"file": "ACE's merges against others"},
        ),
        scores_parquet=f"{ACE_TABLE}_scores.parquet",
        scores_tex=f"{ACE_TABLE}_scores.tex",
        png=report(
            f"{FIGURE_ACE}.png",
            caption="../report/figure_ace.rst",
            category="ACE under DP",
            labels={"file": "ACE under DP figure"},
        ),
        pdf=f"{FIGURE_ACE}.pdf",
    params:
        operators=" ".join(ACE["operators"]),
        labels=ace_labels(),
    log:
        result("logs/ace_report.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        f"dpmerge ace-report --gates {{input.gates}} --scores {{input.scores}} --operators {{params.operators}} "
        f"--labels {{params.labels:q}} --out-prefix {ACE_TABLE} --figure {{output.png}} {{output.pdf}} > {{log}} 2>&1"
