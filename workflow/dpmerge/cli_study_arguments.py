"""The studies' commands of the `dpmerge` command line: empirical audits, releases made from releases (mixtures,
combinations, denoised vectors) and the studies' own reports. cli_arguments.build_parser calls each group; like it,
torch-free and free of the config check.
"""

from __future__ import annotations

from dpmerge.cli_types import SPEC_HELP, STUDY_KEY_HELP, KeyValues, NamedGroups, add_replace_release, json_object
from dpmerge.merge.specs import DENOISERS
from dpmerge.methods import METHODS

METHOD_NAMES = ", ".join(METHODS)


def audits(add) -> None:
    """The commands of empirical audits of releases and merges."""
    p = add("audit", "audit.audit", "Lower-bound a fine-tune's epsilon empirically: one run with white-box "
                                    "Dirac canaries "
                     "(Steinke, Nasr & Jagielski, arXiv 2305.08846), the bound at 95 % confidence beside the "
                     "accountant's epsilon for the run; FAIL when the bound exceeds it. The run is never released.")
    p.add_argument("--backbone", required=True, help="backbone name (as in the config)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--data", required=True, help="prepared task file from 'dpmerge prepare'")
    p.add_argument("--method", required=True, help=f"one of {METHOD_NAMES}")
    p.add_argument("--epsilon", type=float, default=None,
                   help="target epsilon of the audited mechanism, as for finetune; omitted for nonprivate")
    p.add_argument("--seed", type=int, default=0, help="repetition index of the audit run")
    p.add_argument("--study-key", required=True, help=STUDY_KEY_HELP)
    p.add_argument("--hparams", default={}, type=json_object, help="JSON of FinetuneConfig fields, as for finetune")
    p.add_argument("--kind", choices=("white_box", "black_box"), default="white_box",
                   help="white_box: Dirac gradient canaries in the DP step, scored on the task vector; black_box: "
                        "mislabeled held-out test examples in the training set, scored by the model's loss")
    p.add_argument("--canaries", type=int, default=1000,
                   help="canaries m, each in the training set with probability 1/2 (white_box: at most the task "
                        "vector's coordinates; black_box: at most the task's test examples)")
    p.add_argument("--audit-delta", type=float, default=1e-5,
                   help="delta the bound is stated at; 2 m delta must stay below 0.1")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound")
    p.add_argument("--zeroshot-head", nargs="?", default=None, const=None,
                   help="frozen head from 'dpmerge zeroshot-head' (CLIP backbones)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--group", action=NamedGroups, dest="groups", default={}, metavar="NAME=CLASS[,CLASS...]",
                   help="black_box: also bound this group of classes' canaries alone (and the other classes' as "
                        "'rest'), e.g. grayscale=camera on photos (repeatable)")
    p.add_argument("--keep-run", default=None,
                   help="private file (mode 0600) keeping the run's vector, head and canaries with their secret "
                        "coins, for 'dpmerge audit-merge'")
    add_replace_release(p)
    p.add_argument("-o", "--out", required=True, help="the audit's row .parquet")

    p = add("audit-report", "audit.audit_report", "The audits' table (per backbone, method and target epsilon: "
                                                  "the claim at the audit's "
                            "delta and the release group's pooled bound per kind, individual and merged) and figure "
                            "(bounds against claims, with the diagonal).")
    p.add_argument("audit_files", metavar="audits", nargs="+",
                   help="audit rows from 'dpmerge audit', 'dpmerge audit-merge' and 'dpmerge audit-pool'")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet, PREFIX.md, PREFIX.tex")
    p.add_argument("--figure", nargs="+", required=True, help="figure file(s): .png and/or .pdf")

    p = add("audit-merge", "audit.audit_merged", "Audit merged models: merge the kept audit runs of one release "
                                                 "group (one per task, "
                           "'dpmerge audit --keep-run') and bound each task's epsilon from its canaries on the "
                           "merged model; FAIL when a bound exceeds the task's claim (merging is post-processing).")
    p.add_argument("runs", nargs="+", help="kept audit runs, one per task")
    p.add_argument("--method", dest="operator", required=True, help="merge operator (see 'dpmerge merge --help')")
    p.add_argument("--param", action=KeyValues, dest="params", default={},
                   help="operator hyperparameter key=value (repeatable)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--keep-scores", default=None,
                   help="private file (mode 0600) keeping every task's canary scores on the merged model with their "
                        "secret coins, for 'dpmerge audit-pool'")
    p.add_argument("-o", "--out", required=True, help="one row per task .parquet")

    p = add("audit-pool", "audit.audit_pooled", "One audit of a whole release group: the canaries of every kept "
                                                "run (its tasks and seeds) "
                          "pooled into one bound, and per merge operator every task's canaries on the merged "
                          "models; independent runs, each private in its own canaries, are one valid audit with "
                          "the power of all their canaries. FAIL when a bound exceeds the largest claim.")
    p.add_argument("runs", nargs="+", help="kept audit runs ('dpmerge audit --keep-run') of one backbone, method, "
                                           "budget and kind")
    p.add_argument("--merged", nargs="*", default=[],
                   help="kept merged scores ('dpmerge audit-merge --keep-scores') of those runs (default: none)")
    p.add_argument("-o", "--out", required=True, help="the pooled rows .parquet (individual, then per operator)")


def releases_without_training(add) -> None:
    """The commands of releases made from releases: mixtures, combinations, denoised vectors."""
    p = add("mix", "mix.mix", "A task's release at a target epsilon from its releases at other budgets, "
                              "without training "
                   "(random selection, arXiv 2604.20985): release one component with probabilities that meet "
                   "(target, delta) by joint convexity, sum_i p_i delta_i(eps) <= delta, each delta_i(eps) from "
                   "its record's privacy loss distribution; the draw comes from the study key. Its epsilon holds "
                   "for a deployment that releases only the mixture, not the components.")
    p.add_argument("--task-vectors", nargs="+", required=True,
                   help="one task's task vectors at several budgets (one method, seed and w0)")
    p.add_argument("--heads", nargs="+", required=True, help="their heads, in the same order")
    p.add_argument("--target-epsilon", type=float, required=True, help="the mixture's epsilon at --delta")
    p.add_argument("--delta", type=float, default=None, help="target delta (default: the components' smallest)")
    p.add_argument("--utilities", type=float, nargs="+", default=None,
                   help="each component's expected utility, e.g. its score on public data, never on a private "
                        "split (default: its own budget epsilon: more budget, more utility)")
    p.add_argument("--study-key", required=True, help=STUDY_KEY_HELP)
    p.add_argument("--rng", choices=["keyed", "secure"], default="keyed", help="the draw's generator")
    p.add_argument("--out-vector", required=True, help="the released task vector .safetensors")
    p.add_argument("--out-head", required=True, help="its head .safetensors")

    p = add("combine", "mix.combine", "A task's release at a target epsilon as a linear combination sum_i a_i w_i "
                                      "of independent "
                       "repetitions of its release at one budget (task vectors and heads alike): post-processing "
                       "of releasing them all, so it spends their composition, which must meet the target. It "
                       "averages the components' independent noise down; it never reaches a budget below them.")
    p.add_argument("--task-vectors", nargs="+", required=True,
                   help="two or more of one task's task vectors at one budget by one method, from distinct seeds")
    p.add_argument("--heads", nargs="+", required=True, help="their heads, in the same order")
    p.add_argument("--target-epsilon", type=float, required=True,
                   help="the epsilon the composition must meet, at the components' delta")
    p.add_argument("--weights", type=float, nargs="+", default=None, help="a_i, one per component (default: 1/k)")
    p.add_argument("--seed", type=int, default=0, help="the combination's own repetition index")
    p.add_argument("--out-vector", required=True, help="the released task vector .safetensors")
    p.add_argument("--out-head", required=True, help="its head .safetensors")
    p.add_argument("--release-log", default=None,
                   help="the study's release log (<results>/private/releases.jsonl), where the combination is logged "
                        "as a function of its components before it is written (default: not logged)")

    p = add("denoise", "denoise.denoise", "A released task vector denoised from the vector alone: each weight "
                                          "matrix's singular values "
                   "against the noise floor estimated from its own spectrum (Gavish-Donoho), other tensors shrunk by "
                   "James-Stein. Post-processing: the output keeps the release's record and epsilon, names the "
                   "release it is a function of, and records each tensor's noise level and kept rank.")
    p.add_argument("--task-vector", required=True, help="a released (or plain) task vector .safetensors")
    p.add_argument("--method", choices=list(DENOISERS), default="svd_shrink",
                   help="; ".join(f"{name}: {text}" for name, text in DENOISERS.items()))
    p.add_argument("-o", "--out", required=True, help="the denoised task vector .safetensors")

    p = add("mix-report", "mix.mix_report", "The mixing table (PREFIX.parquet, .md, .tex) and figure: merged "
                                            "models of mixtures "
                          "('dpmerge mix') beside merged models of releases trained at each budget; every "
                          "mixture's epsilon recomputed from its record.")
    p.add_argument("--mixed", nargs="+", required=True, help="the mixtures' merged scores (.parquet)")
    p.add_argument("--vectors", nargs="+", required=True, help="the mixed task vectors (.safetensors)")
    p.add_argument("--trained", nargs="+", required=True, help="the trained releases' merged scores (.parquet)")
    p.add_argument("--combined", nargs="*", default=[],
                   help="the combinations' merged scores (.parquet; 'dpmerge combine' outputs merged; default: none)")
    p.add_argument("--combined-vectors", nargs="*", default=[],
                   help="the combined task vectors (.safetensors; default: none)")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet, PREFIX.md, PREFIX.tex")
    p.add_argument("--figure", nargs="+", required=True, help="figure file(s): .png and/or .pdf")


def study_reports(add) -> None:
    """The commands of the studies' own tables."""
    p = add("noise-scale", "noise_scale.noise_scale", "One release group's effective noise scale "
                                                      "T = lr x D x sqrt(s_sample^2 + s_dp^2) per "
                           "task (diagnostics/noise_scale.py: s_dp = sigma C / B from the release's record, s_sample "
                           "from per-example gradients at the released model on the fixed test subsample, D the "
                           "growth AdamW's weight decay gives a scale-invariant weight's step), joined with the "
                           "group's individual and merged scores and loss barriers.")
    p.add_argument("--backbone-spec", required=True, type=json_object,
                   help="the backbone's spec (JSON, as the pipeline writes it)")
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--task-vectors", nargs="+", required=True, help="the group's task vectors, one per task")
    p.add_argument("--heads", nargs="+", required=True, help="their heads, in the same order")
    p.add_argument("--data", nargs="+", required=True, help="their prepared tasks, in the same order")
    p.add_argument("--individual", required=True, help="the group's individual scores (.parquet, dpmerge evaluate)")
    p.add_argument("--merged", required=True, help="the group's merged scores (.parquet, dpmerge evaluate)")
    p.add_argument("--interpolation", required=True, help="the group's barriers (.parquet, dpmerge interpolate)")
    p.add_argument("--label", required=True, help="the release group's label, e.g. naive_dp-lr0.02")
    p.add_argument("--sweep", required=True, choices=["centre", "lr", "batch_size", "weight_decay", "epsilon"],
                   help="which hyperparameter this group varies from the configured run (centre: none)")
    p.add_argument("--max-examples", type=int, default=64,
                   help="test examples of the gradient-variance probe (default 64)")
    p.add_argument("-o", "--out", required=True, help="rows .parquet, one per task")

    p = add("ace-report", "report.ace_report",
            "ACE-Merging under DP: its gate and the noise floor on the releases per budget (PREFIX_gates.*), each "
            "operator's merged score per budget with DP-Merging - DP paired by seed (PREFIX_scores.*), a figure.")
    p.add_argument("--gates", nargs="+", required=True, help="'dpmerge ace-gates' files")
    p.add_argument("--scores", nargs="+", required=True, help="merged score files ('dpmerge evaluate')")
    p.add_argument("--operators", nargs="+", required=True, help="merge entries compared, in the tables' order")
    p.add_argument("--labels", type=json_object, default={},
                   help="JSON: a display name per merge entry, e.g. '{\"ace_e1\": \"ACE E1\"}' (default: names)")
    p.add_argument("--out-prefix", required=True,
                   help="writes PREFIX_gates.* and PREFIX_scores.* (.parquet, .md, .tex)")
    p.add_argument("--figure", nargs="+", required=True, help="figure file(s): .png and/or .pdf")

    p = add("denoise-report", "denoise.denoise_report",
            "Denoised releases: each pair of merge entries (one denoising its inputs) on naive-DP and DP-Merging "
            "releases per budget beside the Pretrained row, with the readings paired by seed (PREFIX.*), what "
            "denoising found in the releases (PREFIX_noise.*), and a figure.")
    p.add_argument("--scores", nargs="+", required=True, help="merged score files ('dpmerge evaluate') of both entries")
    p.add_argument("--pretrained", nargs="*", default=[],
                   help="the Pretrained row's individual score files (default: none, no Pretrained column)")
    p.add_argument("--vectors", nargs="+", required=True, help="the denoised task vectors ('dpmerge denoise')")
    p.add_argument("--pairs", nargs="+", required=True, help="DENOISED=PLAIN: each denoised merge entry and its twin")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.* and PREFIX_noise.* (.parquet, .md, .tex)")
    p.add_argument("--figure", nargs="+", required=True, help="figure file(s): .png and/or .pdf")

    p = add("noise-report", "noise_scale.noise_report", "The effective-noise table (PREFIX.parquet, .md, .tex) "
                                                        "and figure: every setting's merge "
                            "success against T (mean over seeds, 95 % interval), with the best non-private "
                            "setting's T* marked; and the study's paired readings over seeds (PREFIX_readings.*).")
    p.add_argument("--rows", nargs="+", required=True, help="'dpmerge noise-scale' files")
    p.add_argument("--out-prefix", required=True,
                   help="writes PREFIX.parquet, PREFIX.md, PREFIX.tex and PREFIX_readings.{parquet,md,tex}")
    p.add_argument("--figure", nargs="+", required=True, help="figure file(s): .png and/or .pdf")
