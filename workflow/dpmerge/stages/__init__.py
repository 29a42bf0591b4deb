"""The pipeline's stages: what each `dpmerge` subcommand (and so each Snakemake rule) does, as functions of
paths and settings that check them, read their inputs and write their outputs. cli.py hands each command's parsed
flags to the stage function cli_arguments.py names for it; nothing below imports this package.

Modules: prepare (pretrained, prepare, zeroshot-head; prepare-data and make-standins by hand), finetune,
audit (audit, audit-merge, audit-pool, audit-report), merge (statistics, merge), task_vector (task-vector),
evaluate, diagnose (drift, interpolate, curvature, landscape, linearity), mix (mix, combine, mix-report),
noise_scale (noise-scale, noise-report), denoise (denoise, denoise-report), report (table, plot-*, answer,
select-budget), ledger; common holds what several share.
"""
