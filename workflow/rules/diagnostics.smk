# Geometric diagnostics of each release group: reference drift, interpolation paths to the merged model,
# curvature (sharpness, Hessian lambda_max, merge gap beside Theorem 5.2's bound), joint-task linearity of task
# pairs (Theorem C.8) and the 2-D loss landscape around a merged model.


rule drift:
    input:
        base=PRETRAINED,
        vectors=per_task(TV),
    output:
        DRIFT,
    log:
        result("logs/drift/{backbone}/{eps}/{method}/{seed}.log"),
    conda:
        DPMERGE_ENV
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
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        f"{GPU_JOB}"
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
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        f"{GPU_JOB}"
        "dpmerge curvature --backbone-spec {params.spec:q} --base {input.base} --merged {input.merged} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} --rho {params.rho} "
        "--iterations {params.iterations} --gammas {params.gammas} --max-examples {params.max_examples} "
        "--threads {threads} -o {output} > {log} 2>&1"


rule landscape:
    input:
        base=PRETRAINED,
        merged=landscape_merged_model,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        LANDSCAPE,
    params:
        spec=backbone_spec,
        plane=config["diagnostics"]["landscape"]["plane"],
        points=config["diagnostics"]["landscape"]["points"],
        span=config["diagnostics"]["landscape"]["span"],
        max_examples=config["diagnostics"]["landscape"]["max_examples"],
        seed=config["diagnostics"]["landscape"]["seed"],
    log:
        result("logs/landscape/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/landscape/{backbone}/{eps}/{method}/{seed}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="2h",
    shell:
        f"{GPU_JOB}"
        "dpmerge landscape --backbone-spec {params.spec:q} --base {input.base} --merged {input.merged} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} --plane {params.plane} "
        "--points {params.points} --span {params.span} --max-examples {params.max_examples} --seed {params.seed} "
        "--threads {threads} -o {output} > {log} 2>&1"


rule linearity:
    input:
        curvature=CURVATURE,
        base=PRETRAINED,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        LINEARITY,
    params:
        spec=backbone_spec,
        alphas=" ".join(str(a) for a in config["diagnostics"]["curvature"]["alphas"]),
        max_examples=config["diagnostics"]["curvature"]["max_examples"],
    log:
        result("logs/linearity/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/linearity/{backbone}/{eps}/{method}/{seed}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        f"{GPU_JOB}"
        "dpmerge linearity --curvature {input.curvature} --backbone-spec {params.spec:q} --base {input.base} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} --alphas {params.alphas} "
        "--max-examples {params.max_examples} --threads {threads} -o {output} > {log} 2>&1"
