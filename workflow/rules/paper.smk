# Tables and figures assembled from the scores and diagnostics.


rule table1:
    input:
        table_scores,
    output:
        multiext(TABLE1, ".parquet", ".md", ".tex"),
    params:
        prefix=TABLE1,
        caption=table1_caption,
    log:
        result("logs/table1/{backbone}_{eps}.log"),
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge table {input} --caption {params.caption:q} --out-prefix {params.prefix} > {log} 2>&1"


rule figure_interpolation:
    input:
        table_curves,
    output:
        multiext(FIGURE_INTERPOLATION, ".png", ".pdf"),
    params:
        title=interpolation_title,
    log:
        result("logs/figure_interpolation/{backbone}_{eps}.log"),
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge plot-interpolation {input} --title {params.title:q} -o {output} > {log} 2>&1"
