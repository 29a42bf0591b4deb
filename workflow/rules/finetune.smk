# Fan-out: pretrained weights, cached trunk features per task, one private fine-tune per
# (backbone, task, epsilon, method, seed).


rule pretrained:
    output:
        PRETRAINED,
    params:
        spec=weights_spec,
    log:
        result("logs/pretrained/{backbone}.log"),
    benchmark:
        result("benchmarks/pretrained/{backbone}.tsv")
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime="10m",
    shell:
        "dpmerge pretrained --backbone {wildcards.backbone} --backbone-spec {params.spec:q} "
        "--out {output} > {log} 2>&1"


rule prepare:
    input:
        own_task_files,
    output:
        DATA,
    params:
        spec=backbone_spec,
        own_task=own_task_argument,
        max_train=config["data"]["max_train"] or 0,
        max_test=config["data"]["max_test"] or 0,
        seed=config["data"]["seed"],
        validation=(
            f"--validation-fraction {config['data']['validation_fraction']}"
            if config["data"].get("validation_fraction")
            else ""
        ),
    log:
        result("logs/prepare/{backbone}/{task}.log"),
    benchmark:
        result("benchmarks/prepare/{backbone}/{task}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        runtime=backbone_resource("runtime", "30m"),
        gpu=gpus,
        sampling_limits=sampling_limits_of,
    shell:
        f"{GPU_JOB}"
        "dpmerge prepare --backbone {wildcards.backbone} --backbone-spec {params.spec:q} "
        "--task {wildcards.task} --max-train {params.max_train} --max-test {params.max_test} "
        "--data-seed {params.seed} {params.validation} "
        f"{DATA_DIR_ARGUMENT} {{params.own_task}} --sampling-limits {{resources.sampling_limits:q}} "
        "--workers {threads} --threads {threads} --out {output} > {log} 2>&1"


# CLIP backbones classify with a frozen zero-shot head per task (text encoder x class names x prompts): public
# weights and public names, computed once per (backbone, task) and shared by every method, budget and seed.
rule zeroshot_head:
    input:
        data=DATA,
    output:
        ZEROSHOT_HEAD,
    params:
        spec=backbone_spec,
    log:
        result("logs/zeroshot_head/{backbone}/{task}.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=backbone_resource("mem_mb", 4000),
        runtime="30m",
        gpu=gpus,
    shell:
        f"{GPU_JOB}"
        "dpmerge zeroshot-head --backbone {wildcards.backbone} --backbone-spec {params.spec:q} "
        "--data {input.data} --out {output} > {log} 2>&1"


rule finetune:
    input:
        data=DATA,
        zeroshot=zeroshot_head_input,
    output:
        # Released once: read-only, so no later run overwrites a finished release (its budget is spent). To
        # retrain on purpose, delete the files.
        vector=protected(TV),
        head=protected(HEAD),
    params:
        spec=backbone_spec,
        hparams=finetune_hparams,
        epsilon=epsilon_argument,
        seed=seed_number,
        # Not an output: Snakemake deletes a failed job's outputs, and this must survive a kill to resume.
        checkpoint=result("checkpoints/{backbone}/{eps}/{method}/{seed}/{task}.pt"),
    log:
        result("logs/finetune/{backbone}/{eps}/{method}/{seed}/{task}.log"),
    benchmark:
        result("benchmarks/finetune/{backbone}/{eps}/{method}/{seed}/{task}.tsv")
    conda:
        DPMERGE_ENV
    threads: config["threads"]
    resources:
        mem_mb=backbone_resource("mem_mb", 6000),
        runtime=backbone_resource("runtime", "12h"),
        gpu=gpus,
        # Neither is a setting of the release, so neither may rerun it: not params (a changed param reruns the
        # job), and not written into the command's text (Snakemake's `code` trigger compares that text).
        checkpoint_every=config["checkpoint_every"],
        replace_release="yes" if config["privacy"]["replace_releases"] else "no",
    shell:
        # The key's path is part of the command: it changes only with the results folder, which reruns all anyway.
        f"{GPU_JOB}"
        "dpmerge finetune --backbone {wildcards.backbone} --backbone-spec {params.spec:q} "
        "--data {input.data} --zeroshot-head {input.zeroshot} --method {wildcards.method} {params.epsilon} --seed {params.seed} "
        "--hparams {params.hparams:q} "
        f"--study-key {STUDY_KEY} "
        "--threads {threads} "
        "--out-vector {output.vector} --out-head {output.head} --checkpoint {params.checkpoint} "
        "--checkpoint-every {resources.checkpoint_every} --replace-release {resources.replace_release} "
        "> {log} 2>&1"


rule privacy_ledger:
    input:
        # the denoised releases too: the ledger finds the release each one came from and charges nothing
        vectors=all_task_vectors() + all_denoised_vectors(),
        statistics=all_statistics(),
        audits=all_audit_rows(),
    output:
        table=LEDGER_TABLE,
        statistics=LEDGER_STATISTICS,
        report=report(
            LEDGER_REPORT, caption="../report/privacy_ledger.rst", category="Privacy", labels={"file": "ledger"}
        ),
        check=LEDGER_CHECK,
    log:
        result("logs/privacy_ledger.log"),
    conda:
        DPMERGE_ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime="10m",
    shell:
        "dpmerge ledger {input.vectors} --statistics {input.statistics} --out {output.table} "
        "--statistics-out {output.statistics} --report {output.report} --check-out {output.check} "
        f"--audits {{input.audits}} --release-log {RELEASE_LOG} > {{log}} 2>&1"
