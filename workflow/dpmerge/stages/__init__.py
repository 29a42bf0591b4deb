"""The pipeline's stages: what each `dpmerge` subcommand (and so each Snakemake rule) does, as functions of
paths and settings that read their inputs and write their outputs. cli.py parses and checks the command line
and calls one of them; nothing below imports this package.

Modules by rule: prepare (pretrained, prepare, zeroshot_head; `prepare-data` and `make-standins` by hand),
finetune (finetune), merge (merge_statistics, merge), evaluate (evaluate_individual, and merge for the merged model),
diagnose (drift, interpolation, curvature, landscape, linearity), report (table1, table4-8,
figure_interpolation, figure_sharpness_drift, figure_gap_bound, figure_landscape), ledger (privacy_ledger).
"""
