# Fan-in: merge each release group's task vectors with every configured operator and score the merged model,
# and score every individual model on its task's (or every task's) test set.


rule merge_statistics:
    input:
        base=PRETRAINED,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
        public=public_data_input,
    output:
        STATISTICS,
    params:
        spec=backbone_spec,
        flags=statistics_params,
        public=public_data_flag,
    log:
        result("logs/merge_statistics/{backbone}/{eps}/{method}/{seed}/{operator}.log"),
    benchmark:
        result("benchmarks/merge_statistics/{backbone}/{eps}/{method}/{seed}/{operator}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
        # not a setting of the release: a resource, so changing it reruns nothing (finetune.smk)
        replace_release="yes" if config["privacy"]["replace_releases"] else "no",
    shell:
        f"{GPU_JOB}"
        "dpmerge statistics {params.flags} {params.public} "
        f"--study-key {STUDY_KEY} --replace-release {{resources.replace_release}} "
        "--backbone-spec {params.spec:q} --base {input.base} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} --threads {threads} "
        "-o {output} > {log} 2>&1"


# The main grid's release groups in one job each: torch, the backbone and the tasks' test data are loaded once
# for the individual scores and every data-free merge (made and scored), where one job per file loaded them for
# each (merge_common.smk: GROUP_MERGES). A change of any of these merges' settings reruns the group's job.
ruleorder: merge_group > merge
ruleorder: merge_group > evaluate_individual


rule merge_group:
    input:
        base=PRETRAINED,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        individual=SCORES_INDIVIDUAL,
        merged=expand(MERGED, operator=GROUP_MERGES, allow_missing=True),
        scores=expand(SCORES_MERGED, operator=GROUP_MERGES, allow_missing=True),
    params:
        spec=backbone_spec,
        merges=group_merges_json,
        files=lambda wildcards, output: group_merge_files(output),
        own_task="" if config["evaluation"]["cross_task"] else "--own-task-only",
    log:
        result("logs/merge_group/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/merge_group/{backbone}/{eps}/{method}/{seed}.tsv")
    wildcard_constraints:
        **GROUP_CONSTRAINTS,
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        f"{GPU_JOB}"
        "dpmerge score-group --backbone-spec {params.spec:q} --base {input.base} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} {params.own_task} "
        "--individual-out {output.individual} --merges {params.merges:q} {params.files} "
        "--require-privacy-record --threads {threads} > {log} 2>&1"


# A merged model is scored in the job that makes it: one job per (release group, merge) instead of two, and the
# scores rerun whenever the model does.
rule merge:
    input:
        base=PRETRAINED,
        vectors=merge_vectors,
        statistics=merge_statistics_files,
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        merged=MERGED,
        scores=SCORES_MERGED,
    params:
        hyper=operator_params,
        spec=backbone_spec,
    log:
        result("logs/merge/{backbone}/{eps}/{method}/{seed}/{operator}.log"),
    benchmark:
        result("benchmarks/merge/{backbone}/{eps}/{method}/{seed}/{operator}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        # --require-privacy-record: in the study every input is a release; only a record-less merge by hand warns
        f"{GPU_JOB}"
        "(dpmerge merge {params.hyper} --require-privacy-record --base {input.base} -o {output.merged} "
        "{input.vectors} && "
        "dpmerge evaluate --backbone-spec {params.spec:q} --base {input.base} --merged {output.merged} "
        "--heads {input.heads} --data {input.data} --threads {threads} -o {output.scores}) > {log} 2>&1"


rule evaluate_individual:
    input:
        base=PRETRAINED,
        vectors=per_task(TV),
        heads=per_task(HEAD),
        data=per_task(DATA),
    output:
        SCORES_INDIVIDUAL,
    params:
        spec=backbone_spec,
        own_task="" if config["evaluation"]["cross_task"] else "--own-task-only",
    log:
        result("logs/evaluate_individual/{backbone}/{eps}/{method}/{seed}.log"),
    benchmark:
        result("benchmarks/evaluate_individual/{backbone}/{eps}/{method}/{seed}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        gpu=gpus,
        runtime="1h",
    shell:
        f"{GPU_JOB}"
        "dpmerge evaluate --backbone-spec {params.spec:q} --base {input.base} "
        "--task-vectors {input.vectors} --heads {input.heads} --data {input.data} {params.own_task} "
        "--threads {threads} -o {output} > {log} 2>&1"
