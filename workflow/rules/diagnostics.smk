# Geometric diagnostics of each release group: reference drift, interpolation paths to the merged model, and
# curvature (sharpness, Hessian lambda_max, merge gap beside Theorem 5.2's bound).


rule drift:
    input:
        base=PRETRAINED,
        vectors=per_task(TV),
    output:
        DRIFT,
    log:
        result("logs/drift/{backbone}/{eps}/{method}/{seed}.log"),
    threads: 1
    resources:
        mem_mb=2000,
        runtime="30m",
    shell:
        "dpmerge drift --base {input.base} --task-vectors {input.vectors} -o {output} > {log} 2>&1"


rule interpolation:
    input:
        base=PRETRAINED,
        merged=interpolation_merged_model,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        INTERPOLATION,
    params:
        spec=backbone_spec,
        points=config["diagnostics"]["interpolation"]["points"],
        max_examples=config["diagnostics"]["interpolation"]["max_examples"],
    log:
        result("logs/interpolation/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/interpolation/{backbone}/{eps}/{method}/{seed}.tsv")
    threads: config["threads"]
    resources:
        mem_mb=4000,
        runtime="1h",
    shell:
        "dpmerge interpolate --backbone-spec {params.spec:q} --base {input.base} --merged {input.merged} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} "
        "--points {params.points} --max-examples {params.max_examples} --threads {threads} "
        "-o {output} > {log} 2>&1"


rule curvature:
    input:
        base=PRETRAINED,
        merged=curvature_merged_model,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        CURVATURE,
    params:
        spec=backbone_spec,
        rho=config["diagnostics"]["curvature"]["rho"],
        iterations=config["diagnostics"]["curvature"]["iterations"],
        gammas=" ".join(str(g) for g in config["diagnostics"]["curvature"]["gammas"]),
        max_examples=config["diagnostics"]["curvature"]["max_examples"],
    log:
        result("logs/curvature/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/curvature/{backbone}/{eps}/{method}/{seed}.tsv")
    threads: config["threads"]
    resources:
        mem_mb=4000,
        runtime="1h",
    shell:
        "dpmerge curvature --backbone-spec {params.spec:q} --base {input.base} --merged {input.merged} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} --rho {params.rho} "
        "--iterations {params.iterations} --gammas {params.gammas} --max-examples {params.max_examples} "
        "--threads {threads} -o {output} > {log} 2>&1"
