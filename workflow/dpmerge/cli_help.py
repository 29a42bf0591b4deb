"""What `dpmerge --help` lists: the commands a researcher runs by hand apart from the steps only the pipeline's
rules call, a one-line summary of each, and every researcher command's example (the last lines of its --help).

Kept apart from cli_arguments.py, which holds the options: this is the prose of the front door. The examples
use the pipeline's own file layout (the default config's effnet backbone under results/; mix and combine under
results_mixing/), so each runs as written once `make demo` (or `make mixing`) has made those files;
tests/test_cli.py parses every one with the real parser.
"""

from __future__ import annotations

# The default config's effnet backbone as the pipeline spells it (weights_spec in workflow/rules/settings.smk)
EFFNET_SPEC = """'{"image_size": 64, "kind": "efficientnet_lite0", "trainable_blocks": 1}'"""
GROUP = "results/taskvectors/effnet/eps4/dp_merging/s0"  # one release group: effnet, eps 4, dp_merging, seed 0
HEADS = "results/heads/effnet/eps4/dp_merging/s0"
W0 = "results/pretrained/effnet.safetensors"

# In the order a researcher meets them: stand-ins or data, merges, scores, the privacy record, other budgets
RESEARCHER_COMMANDS = {
    "make-standins": "tiny random CLIP, RoBERTa and paper datasets to try things on",
    "prepare-data": "download one of the paper's datasets (online)",
    "task-vector": "a task vector from a pretrained and a fine-tuned checkpoint",
    "merge": "merge task vectors with one operator (files, shards, model folders)",
    "statistics": "the Gram / Fisher statistics regmean and fisher merges read",
    "evaluate": "score individual or merged models on every task",
    "table": "a paper table (Tables 1-8) from evaluation files",
    "signal-check": "does each task's individual model beat chance?",
    "ledger": "collect and check the privacy records of releases",
    "audit": "lower-bound a fine-tune's epsilon with canaries",
    "mix": "a task's release at a new epsilon from releases at others",
    "combine": "a task's release at a target epsilon from repeated ones",
    "denoise": "a release denoised at its noise floor, at no new budget",
}

# In the pipeline's order: data and w0, fine-tuning, diagnostics, audits and mixtures, figures, the report
PIPELINE_STEPS = {
    "prepare": "load a task and cache the frozen trunk's features",
    "pretrained": "save w0, the pretrained weights of the merged parameters",
    "zeroshot-head": "a task's CLIP zero-shot head from its class names",
    "finetune": "fine-tune one task privately; release vector and head",
    "score-group": "a release group's individual models and merges, one job",
    "drift": "reference drift ||w_t - w0|| / ||w0|| (Fig. 3b)",
    "ace-gates": "ACE-Merging's gamma, gate and noise floor per matrix",
    "interpolate": "loss from each task model to the merged one (Fig. 2)",
    "curvature": "sharpness, lambda_max, merge gap, Theorem 5.2's bound",
    "linearity": "joint-task loss linearity per task pair (Theorem C.8)",
    "landscape": "2-D loss landscape around a merged model (Figs. 4, 5)",
    "noise-scale": "a release group's effective noise scale T per task",
    "noise-report": "the effective-noise table and figure",
    "audit-merge": "audit merged models of kept audit runs",
    "audit-pool": "one pooled audit of a whole release group",
    "audit-report": "the audits' table and figure",
    "mix-report": "the mixing table and figure",
    "ace-report": "ACE under DP: its gate, the noise floor, its merges",
    "denoise-report": "denoised releases merged against trained ones",
    "plot-sharpness-drift": "Fig. 3: sharpness and drift against epsilon",
    "plot-gap-bound": "merge gap against Theorem 5.2's bound",
    "plot-interpolation": "interpolation curves per task and method",
    "plot-landscape": "contours of loss landscapes (Figs. 4, 5)",
    "select-budget": "the training-budget protocol's choice",
    "answer": "the study's answer on one page (the report's front page)",
}

# Each example as the lines it is shown on; a backslash joins them in a shell
EXAMPLES = {
    "make-standins": ["dpmerge make-standins --out standins"],
    "prepare-data": ["dpmerge prepare-data --task cars --data-dir data"],
    "task-vector": ["dpmerge task-vector --pretrained bert-base/ --finetuned bert-sst2/ -o sst2.safetensors"],
    "merge": [f"dpmerge merge --method ties --param density=0.2 --base {W0}",
              f"-o merged.safetensors {GROUP}/*.safetensors"],
    "statistics": ["dpmerge statistics --kind gram --source private",
                   "--examples 256 --clip-norm 1.0 --epsilon 1.0 --study-key results/private/study.key",
                   f"--backbone-spec {EFFNET_SPEC}",
                   f"--base {W0}",
                   f"--task-vectors {GROUP}/*.safetensors",
                   f"--heads {HEADS}/*.safetensors",
                   "--data results/data/effnet/*.pt -o gram.safetensors"],
    "evaluate": ["dpmerge evaluate --merged merged.safetensors",
                 f"--backbone-spec {EFFNET_SPEC}",
                 f"--base {W0}",
                 f"--heads {HEADS}/*.safetensors",
                 "--data results/data/effnet/*.pt -o merged_scores.parquet"],
    "table": ["dpmerge table --kind multitask --caption 'effnet, eps = 4' --out-prefix table1",
              "results/scores/individual/effnet/eps*/*/*.parquet",
              "results/scores/merged/effnet/eps*/*/*/*.parquet"],
    "signal-check": ["dpmerge signal-check --out-prefix signal_check",
                     "--scores results/scores/individual/*/*/*/*.parquet"],
    "ledger": ["dpmerge ledger results/taskvectors/*/*/*/*/*.safetensors",
               "-o ledger.parquet --report ledger.md --check-out ledger_check.json"],
    "audit": ["dpmerge audit --backbone effnet --method dp_merging --epsilon 4 --kind white_box --canaries 1000",
              f"--backbone-spec {EFFNET_SPEC}",
              "--data results/data/effnet/digits.pt --study-key results/private/study.key",
              "-o audit_digits.parquet"],
    # mix and combine on `make mixing`'s releases (presets/mixing.yaml: epsilons 1, 1.5 and 4, seeds 0-7)
    "mix": ["dpmerge mix --target-epsilon 1.5 --study-key results_mixing/private/study.key",
            "--task-vectors results_mixing/taskvectors/effnet/eps1/dp_merging/s0/digits.safetensors",
            "results_mixing/taskvectors/effnet/eps4/dp_merging/s0/digits.safetensors",
            "--heads results_mixing/heads/effnet/eps1/dp_merging/s0/digits.safetensors",
            "results_mixing/heads/effnet/eps4/dp_merging/s0/digits.safetensors",
            "--out-vector digits_mixed.safetensors --out-head digits_mixed_head.safetensors"],
    "combine": ["dpmerge combine --target-epsilon 1.5",
                "--task-vectors results_mixing/taskvectors/effnet/eps1/dp_merging/s0/digits.safetensors",
                "results_mixing/taskvectors/effnet/eps1/dp_merging/s1/digits.safetensors",
                "--heads results_mixing/heads/effnet/eps1/dp_merging/s0/digits.safetensors",
                "results_mixing/heads/effnet/eps1/dp_merging/s1/digits.safetensors",
                "--out-vector digits_combined.safetensors --out-head digits_combined_head.safetensors"],
    "denoise": ["dpmerge denoise --method svd_shrink",
                "--task-vector results/taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors",
                "-o digits_denoised.safetensors"],
}


def example_epilog(command: str) -> str | None:
    """The example a researcher command's --help ends with, continuation lines indented under the first."""
    lines = EXAMPLES.get(command)
    if not lines:
        return None
    return "Example:\n  " + " \\\n      ".join(lines)


def command_listing() -> str:
    """The top-level --help's list of commands, researchers' first."""
    def listing(commands):
        return "\n".join(f"  {name:<22}{summary}" for name, summary in commands.items())

    return ("Commands for researchers (run by hand; each one's --help ends with an example):\n"
            f"{listing(RESEARCHER_COMMANDS)}\n\n"
            "Pipeline steps (run by Snakemake's rules; each works by hand too):\n"
            f"{listing(PIPELINE_STEPS)}")

