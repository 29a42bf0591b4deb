# Tables and figures assembled from the scores and diagnostics, each marked for `snakemake --report` with a
# caption from workflow/report/. Tables whose inputs the grid lacks are listed in tables/index.md instead.


rule table1:
    input:
        table_scores,
    output:
        parquet=f"{TABLE1}.parquet",
        markdown=f"{TABLE1}.md",
        latex=f"{TABLE1}.tex",
        html=report(
            f"{TABLE1}.html",
            caption="../report/table.rst",
            category="Tables",
            subcategory="Multi-task scores (Tables 1-3)",
            labels={"backbone": "{backbone}", "epsilon": "{eps}"},
        ),
    params:
        prefix=output_prefix,
        caption=table1_caption,
        metric=table1_metric_flag,
    log:
        result("logs/table1/{backbone}_{eps}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table --kind multitask {params.metric} {input} --caption {params.caption:q} "
        "--out-prefix {params.prefix} > {log} 2>&1"


rule table4:
    input:
        epsilon_sweep_scores(),
    output:
        parquet=f"{TABLE4}.parquet",
        markdown=f"{TABLE4}.md",
        latex=f"{TABLE4}.tex",
        html=report(
            f"{TABLE4}.html",
            caption="../report/table.rst",
            category="Tables",
            subcategory="Privacy budgets (Table 4)",
            labels={"table": "epsilon sweep"},
        ),
    params:
        prefix=output_prefix,
        caption=table4_caption,
        operator=TABLE_OPERATOR,
    log:
        result("logs/table4.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table --kind epsilon_sweep --operator {params.operator} {input} --caption {params.caption:q} "
        "--out-prefix {params.prefix} > {log} 2>&1"


rule table5:
    input:
        table5_scores,
    output:
        parquet=f"{TABLE5}.parquet",
        markdown=f"{TABLE5}.md",
        latex=f"{TABLE5}.tex",
        html=report(
            f"{TABLE5}.html",
            caption="../report/table.rst",
            category="Tables",
            subcategory="Ablation (Table 5)",
            labels={"backbone": "{backbone}", "epsilon": "{eps}"},
        ),
    params:
        prefix=output_prefix,
        caption=table5_caption,
    log:
        result("logs/table5/{backbone}_{eps}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table --kind ablation {input} --caption {params.caption:q} --out-prefix {params.prefix} > {log} 2>&1"


rule table6:
    input:
        table6_scores,
    output:
        parquet=f"{TABLE6}.parquet",
        markdown=f"{TABLE6}.md",
        latex=f"{TABLE6}.tex",
        html=report(
            f"{TABLE6}.html",
            caption="../report/table.rst",
            category="Tables",
            subcategory="Sensitivity (Tables 6, 7)",
            labels={"backbone": "{backbone}", "parameter": "rho"},
        ),
    params:
        prefix=output_prefix,
        caption=sensitivity_caption("rho"),
        operator=TABLE_OPERATOR,
    log:
        result("logs/table6/{backbone}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table --kind rho --operator {params.operator} {input} --caption {params.caption:q} "
        "--out-prefix {params.prefix} > {log} 2>&1"


rule table7:
    input:
        table7_scores,
    output:
        parquet=f"{TABLE7}.parquet",
        markdown=f"{TABLE7}.md",
        latex=f"{TABLE7}.tex",
        html=report(
            f"{TABLE7}.html",
            caption="../report/table.rst",
            category="Tables",
            subcategory="Sensitivity (Tables 6, 7)",
            labels={"backbone": "{backbone}", "parameter": "lambda"},
        ),
    params:
        prefix=output_prefix,
        caption=sensitivity_caption("anchor_lambda"),
        operator=TABLE_OPERATOR,
    log:
        result("logs/table7/{backbone}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table --kind anchor_lambda --operator {params.operator} {input} --caption {params.caption:q} "
        "--out-prefix {params.prefix} > {log} 2>&1"


rule table8:
    input:
        table8_scores,
    output:
        parquet=f"{TABLE8}.parquet",
        markdown=f"{TABLE8}.md",
        latex=f"{TABLE8}.tex",
        html=report(
            f"{TABLE8}.html",
            caption="../report/table.rst",
            category="Tables",
            subcategory="Merge operators (Table 8)",
            labels={"backbone": "{backbone}", "epsilon": "{eps}"},
        ),
    params:
        prefix=output_prefix,
        caption=table8_caption,
    log:
        result("logs/table8/{backbone}_{eps}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table --kind operators {input} --caption {params.caption:q} --out-prefix {params.prefix} > {log} 2>&1"


rule tables_index:
    output:
        report(
            TABLES_INDEX,
            caption="../report/tables_index.rst",
            category="Tables",
            subcategory="Index",
            labels={"table": "index"},
        ),
    params:
        text=tables_index_text(),
    log:
        result("logs/tables_index.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=500,
        runtime="5m",
    shell:
        "printf '%s' {params.text:q} > {output} 2> {log}"


rule figure_interpolation:
    input:
        table_curves,
    output:
        png=report(
            f"{FIGURE_INTERPOLATION}.png",
            caption="../report/figure_interpolation.rst",
            category="Figures",
            subcategory="Interpolation barriers (Fig. 2)",
            labels={"backbone": "{backbone}", "epsilon": "{eps}"},
        ),
        pdf=f"{FIGURE_INTERPOLATION}.pdf",
    params:
        title=interpolation_title,
    log:
        result("logs/figure_interpolation/{backbone}_{eps}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge plot-interpolation {input} --title {params.title:q} -o {output} > {log} 2>&1"


rule figure_sharpness_drift:
    input:
        curvature=backbone_curvature,
        drift=backbone_drift,
    output:
        png=report(
            f"{FIGURE_SHARPNESS_DRIFT}.png",
            caption="../report/figure_sharpness_drift.rst",
            category="Figures",
            subcategory="Sharpness and drift (Fig. 3)",
            labels={"backbone": "{backbone}"},
        ),
        pdf=f"{FIGURE_SHARPNESS_DRIFT}.pdf",
    params:
        title=sharpness_drift_title,
    log:
        result("logs/figure_sharpness_drift/{backbone}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge plot-sharpness-drift --curvature {input.curvature} --drift {input.drift} "
        "--title {params.title:q} -o {output} > {log} 2>&1"


rule figure_gap_bound:
    input:
        backbone_curvature,
    output:
        png=report(
            f"{FIGURE_GAP_BOUND}.png",
            caption="../report/figure_gap_bound.rst",
            category="Figures",
            subcategory="Merge gap vs Theorem 5.2",
            labels={"backbone": "{backbone}"},
        ),
        pdf=f"{FIGURE_GAP_BOUND}.pdf",
    params:
        title=gap_bound_title,
    log:
        result("logs/figure_gap_bound/{backbone}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge plot-gap-bound {input} --title {params.title:q} -o {output} > {log} 2>&1"


rule figure_landscape:
    input:
        landscape_files,
    output:
        png=report(
            f"{FIGURE_LANDSCAPE}.png",
            caption="../report/figure_landscape.rst",
            category="Figures",
            subcategory="Loss landscapes (Figs. 4, 5)",
            labels={"backbone": "{backbone}", "epsilon": "{eps}"},
        ),
        pdf=f"{FIGURE_LANDSCAPE}.pdf",
    params:
        title=landscape_title,
    log:
        result("logs/figure_landscape/{backbone}_{eps}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge plot-landscape {input} --title {params.title:q} -o {output} > {log} 2>&1"


# Each task's individual models against its chance level, before any merged result is read (on every
# configuration; the answer page shows it).
rule signal_check:
    input:
        signal_check_scores(),
    output:
        parquet=f"{SIGNAL_CHECK}.parquet",
        markdown=report(
            f"{SIGNAL_CHECK}.md",
            caption="../report/signal_check.rst",
            category="Tables",
            subcategory="Signal check",
            labels={"table": "signal check"},
        ),
        latex=f"{SIGNAL_CHECK}.tex",
    params:
        nonprivate=config["tables"]["signal_check"]["nonprivate_share"],
        private=config["tables"]["signal_check"]["private_share"],
        prefix=output_prefix,
    log:
        result("logs/signal_check.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="5m",
    shell:
        "dpmerge signal-check --scores {input} --nonprivate-share {params.nonprivate} "
        "--private-share {params.private} --out-prefix {params.prefix} > {log} 2>&1"


# The page the report opens on: DP-Merging - DP per backbone and operator with intervals, the ablation, the
# ledger's verdict (the Snakefile makes it the report's front page once it exists).
rule answer:
    input:
        tables=list(answer_tables().values()),
        ledger=LEDGER_CHECK,
        audits=answer_audit_table(),
        signal=f"{SIGNAL_CHECK}.parquet",
    output:
        markdown=ANSWER,
        rst=ANSWER_RST,
        png=report(
            f"{FIGURE_ANSWER}.png",
            caption="../report/figure_answer.rst",
            category="Figures",
            subcategory="The answer at a glance",
            labels={"figure": "DP-Merging - DP per cell"},
        ),
        pdf=f"{FIGURE_ANSWER}.pdf",
    params:
        tables=" ".join(shlex.quote(f"{s}={p}") for s, p in answer_tables().items()),
        audits=" ".join(f"--audit-table {path}" for path in answer_audit_table()),
        links=" ".join(answer_links()),
        description=os.path.join(workflow.current_basedir, "..", "report", "workflow.rst"),
    log:
        result("logs/answer.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="5m",
    shell:
        "dpmerge answer --table1 {params.tables} --ledger {input.ledger} --link {params.links} "
        "--description {params.description:q} {params.audits} --signal-check {input.signal} "
        "--figure {output.png} {output.pdf} --out-markdown {output.markdown} --out-rst {output.rst} > {log} 2>&1"


# The training-budget protocol's choice (presets/protocol.yaml): one candidate per configured backbone.
rule select_budget:
    input:
        tables=list(protocol_tables().values()),
        signal=f"{SIGNAL_CHECK}.parquet",
    output:
        markdown=PROTOCOL_CHOICE,
        parquet=f"{PROTOCOL_CHOICE.removesuffix('.md')}.parquet",
    params:
        tables=" ".join(f"{b}={path}" for b, path in protocol_tables().items()),
        candidates=json.dumps(protocol_candidates()),
        seeds=len(SEEDS),
    log:
        result("logs/select_budget.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="5m",
    shell:
        "dpmerge select-budget --table1 {params.tables} --candidates {params.candidates:q} --seeds {params.seeds} "
        "--signal-check {input.signal} --out-markdown {output.markdown} --out-parquet {output.parquet} > {log} 2>&1"
