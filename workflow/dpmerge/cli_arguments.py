"""The `dpmerge` command line's arguments: every subcommand with its flags, defaults and help texts (`dpmerge
--help`, `dpmerge <command> --help`). cli.py parses with this parser and dispatches; nothing here runs a stage.
The top-level help's two groups of commands and each researcher command's example come from cli_help.py.

Torch-free, and free of the config check: the merge operators and denoisers listed come from merge/specs.py
(standard library only). Each group of commands declares its own in one function below.
"""

from __future__ import annotations

import argparse

from dpmerge.cli_help import command_listing, example_epilog
from dpmerge.cli_merge_arguments import add_merge_and_score_commands
from dpmerge.cli_study_arguments import METHOD_NAMES, audits, releases_without_training, study_reports
from dpmerge.cli_types import (
    SPEC_HELP,
    STUDY_KEY_HELP,
    DefaultsShown,
    NamedPaths,
    add_replace_release,
    json_object,
)

TABLE_KINDS = {
    "multitask": "Tables 1-3: every method's individual and merged scores per task (--metric-in-header: GLUE style)",
    "epsilon_sweep": "Table 4: --operator's average merged score per privacy budget, naive DP vs DP-Merging",
    "ablation": "Table 5: naive DP, w/o alignment, w/o flatness, full DP-Merging, per operator",
    "rho": "Table 6: DP-Merging + --operator at each SAM radius rho",
    "anchor_lambda": "Table 7: DP-Merging + --operator at each anchor strength lambda",
    "operators": "Table 8: naive DP vs DP-Merging per merge operator",
}


def _version() -> str:
    """The installed distribution's version (pyproject.toml), or 'unknown' when run from a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dpmerge")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpmerge",
        formatter_class=DefaultsShown,
        description="Differentially private fine-tuning, task vectors and data-free merging (DP-Merging).",
        epilog=command_listing(),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # Listed by the epilog in two groups, not as argparse's one flat {a,b,...} of every command
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>",
                                help="one of the commands below; 'dpmerge <command> --help' shows its options "
                                     "with their defaults")

    def add_figure_outputs(p):
        p.add_argument("--title", default="", help="figure title")
        p.add_argument("-o", "--out", nargs="+", required=True, help="output image(s): .png and/or .pdf")

    def add(name, stage, description):
        """One command, run by `stage` ("module.function" of dpmerge.stages): its parsed flags are handed to it by
        name, so each flag's dest is the stage's keyword (tests/test_cli.py holds every command to that)."""
        p = sub.add_parser(name, description=description, epilog=example_epilog(name), formatter_class=DefaultsShown)
        p.set_defaults(stage=stage)
        return p
    _data_and_weights(add)
    _fine_tuning(add)
    audits(add)
    releases_without_training(add)
    study_reports(add)
    add_merge_and_score_commands(add, SPEC_HELP)
    _checkpoints_and_statistics(add)
    _geometry(add)
    _landscape(add)
    _tables_and_figures(add, add_figure_outputs)
    _answer_and_ledger(add)
    return parser


def _data_and_weights(add) -> None:
    """The commands of the data, the trunk's features and w0."""
    p = add("prepare", "prepare.prepare", "Load a task and cache the frozen trunk's features for it.")
    p.add_argument("--backbone", required=True, help="backbone name (as in the config)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--task", required=True, help="task name (see dpmerge.data.registry.TASKS)")
    p.add_argument("--max-train", type=int, default=0, help="cap on training examples (seeded subset; 0 = no cap)")
    p.add_argument("--max-test", type=int, default=0, help="cap on test examples (seeded subset; 0 = no cap)")
    p.add_argument("--data-seed", type=int, default=0,
                   help="seed of the seeded subsets (the train/test split itself is fixed per task)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True, help="output .pt file")

    p.add_argument("--data-dir", default=None,
                   help="directory holding the paper's datasets (data/paper.py layouts); embedded tasks ignore it")
    p.add_argument("--workers", type=int, default=1, help="threads decoding a paper dataset's images")
    p.add_argument("--own-task", type=json_object, default=None,
                   help='your own task\'s config entry as JSON, e.g. \'{"images": "scans", "test_fraction": 0.2}\' '
                        "(the config's own_tasks; docs/your-own.md)")
    p.add_argument("--validation-fraction", type=float, default=None,
                   help="hold this fraction of the training subset out as the evaluation split and never read the "
                        "test split (the budget protocol; default: evaluate on the test split)")
    p.add_argument("--sampling-limits", type=json_object, default=None,
                   help="the largest batch size and delta the task's fine-tunes use, with the config fields that set "
                        "them, refused here (before any fine-tune) when N, read here, is too small for them (the "
                        "workflow passes them; default: no check)")

    p = add("zeroshot-head", "prepare.zeroshot_head",
            "CLIP zero-shot head of one task: text embeddings of its class names in the task's prompt templates.")
    p.add_argument("--backbone", required=True, help="backbone name (as in the config)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--data", required=True, help="prepared task file from 'dpmerge prepare' (for the class names)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True, help="output .safetensors")

    p = add("prepare-data", "prepare.prepare_data",
            "Download one of the paper's datasets into the data directory in the layout 'prepare' reads (online).")
    p.add_argument("--task", required=True, help="a vision task (sun397, cars, ...) or a GLUE task (cola, ...)")
    p.add_argument("--data-dir", required=True,
                   help="directory of the paper's datasets (the config's data.dir); the dataset lands under it in "
                        "the layout 'prepare' reads (dpmerge/data/paper.py)")

    p = add("make-standins", "prepare.make_standins",
            "Write a tiny random CLIP and RoBERTa and tiny copies of the 16 paper datasets in their real formats.")
    p.add_argument("--out", required=True, help="directory; gets clip/, roberta/ and data/")
    p.add_argument("--vision-classes", type=int, default=3, help="classes per stand-in vision dataset")
    p.add_argument("--train-per-class", type=int, default=24,
                   help="training examples per class of each stand-in dataset")
    p.add_argument("--test-per-class", type=int, default=8, help="test examples per class of each stand-in dataset")
    p.add_argument("--image-size", type=int, default=40, help="side of the stand-in images (before resizing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the stand-ins' random weights and images")

    p = add("pretrained", "prepare.pretrained", "Save the pretrained weights w0 of the trainable (merged) parameters.")
    p.set_defaults(threads=1)
    p.add_argument("--backbone", required=True, help="backbone name (as in the config)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--out", required=True, help="output .safetensors")


def _fine_tuning(add) -> None:
    """The commands of private fine-tuning."""
    p = add("finetune", "finetune.finetune", "Fine-tune one task privately and release its task vector and head.")
    p.add_argument("--backbone", required=True, help="backbone name (as in the config)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--data", required=True, help="prepared task file from 'dpmerge prepare'")
    p.add_argument("--method", required=True,
                   help=f"one of {METHOD_NAMES}; a sensitivity run's label such as dp_merging-rho0.1 or "
                        "dp_merging-lambda0.5 must match the value in --hparams")
    p.add_argument("--epsilon", type=float, default=None,
                   help="target epsilon (delta = 1/N unless --hparams gives delta <= 1/N); required by every private "
                        "method, omitted for nonprivate")
    p.add_argument("--seed", type=int, default=0,
                   help="repetition index, recorded in the release (default 0); the randomness comes from the "
                        "study key, not from this number")
    p.add_argument("--study-key", required=True, help=STUDY_KEY_HELP)
    p.add_argument("--hparams", default={}, type=json_object,
                   help="JSON of FinetuneConfig fields (epochs, batch_size, lr, neighbouring, rng, ...)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out-vector", required=True, help="task vector .safetensors")
    p.add_argument("--out-head", required=True, help="task head .safetensors")
    p.add_argument("--checkpoint", help="resumable state file, kept outside the outputs (removed when done); "
                                        "without one a killed job starts over")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    # nargs="?": the workflow passes the flag with an empty value for backbones that train their heads
    p.add_argument("--zeroshot-head", nargs="?", default=None, const=None,
                   help="frozen head from 'dpmerge zeroshot-head' (CLIP backbones); otherwise a fresh head is trained")
    add_replace_release(p)


def _checkpoints_and_statistics(add) -> None:
    """The commands of task vectors from checkpoints, merge statistics."""
    p = add("task-vector", "task_vector.task_vector",
            "A task vector tau = w_finetuned - w_pretrained from two checkpoints as people have them (a .safetensors "
            "file, a sharded *.safetensors.index.json, or a model folder from save_pretrained), one tensor at a "
            "time. Floating-point tensors both hold at one shape enter it; the rest (a new head, buffers) are "
            "listed and recorded. A fine-tuned checkpoint of a model with a head whose names carry a prefix "
            "(bert.embeddings... against embeddings...) is matched to the pretrained names. Carries no privacy "
            "record: 'dpmerge merge' merges it with a warning.")
    p.add_argument("--pretrained", required=True, help="the pretrained checkpoint (file, sharded index or folder)")
    p.add_argument("--finetuned", required=True, help="the fine-tuned checkpoint (file, sharded index or folder)")
    p.add_argument("--dtype", choices=["pretrained", "float32"], default="pretrained",
                   help="precision tau is stored in: the pretrained tensor's own, or float32 (differences of "
                        "bfloat16 weights keep their low bits)")
    p.add_argument("-o", "--out", required=True, help="task vector .safetensors")

    p = add("statistics", "merge.statistics",
            "Per-task RegMean Gram matrices or Fisher diagonals of a release group's task models w0 + tau_t, the "
            "--statistics of 'dpmerge merge --method regmean' or 'fisher'. --source public reads a fixed subset of "
            "the training split of --public-data, a dataset you declare public: published and outside every "
            "private training set (a file of one of the merged tasks is refused), so it spends no privacy "
            "budget. --source private reads each task's own training data: a Poisson sample at rate examples/N "
            "keyed by the study key, each example's whole contribution clipped to --clip-norm, Gaussian noise "
            "calibrated to --epsilon at the task's delta, composed with the task's fine-tuning into a total "
            "epsilon the file records and 'dpmerge ledger' checks. Data held out of a private training set (its "
            "test or validation split) is private too, never --public-data.")
    p.add_argument("--kind", required=True, choices=["gram", "fisher"],
                   help="gram: each layer's input Gram matrix (regmean); fisher: the diagonal Fisher information "
                        "(fisher)")
    p.add_argument("--source", required=True, choices=["public", "private"],
                   help="public: --public-data, at no privacy cost; private: the tasks' training data, privatized "
                        "(needs --clip-norm, --epsilon and --study-key)")
    p.add_argument("--examples", type=int, default=256,
                   help="examples per task (default 256): private, the expected size of a Poisson sample at rate "
                        "examples/N; public, the size of a fixed subset of the public dataset")
    p.add_argument("--clip-norm", type=float, help="private: L2 bound of each example's whole contribution")
    p.add_argument("--epsilon", type=float, help="private: the statistic's own epsilon at the task's delta")
    p.add_argument("--study-key", help="private: " + STUDY_KEY_HELP)
    p.add_argument("--public-data", help="public: the prepared file ('dpmerge prepare') of a dataset declared "
                                         "public, outside every private training set (a split held out of a "
                                         "private task is private)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--task-vectors", nargs="+", required=True,
                   help="the release group's task vectors (.safetensors), one per task, as the merge will read them")
    p.add_argument("--heads", nargs="+", required=True,
                   help="their task heads, same order (fisher's loss reads them)")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, one per task vector")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_replace_release(p)
    p.add_argument("-o", "--out", required=True, help="statistics .safetensors")


def _geometry(add) -> None:
    """The commands of drift, ACE gates and linearity."""
    p = add("drift", "diagnose.drift", "Reference drift ||w_t - w0|| / ||w0|| per task vector (paper Fig. 3b).")
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--task-vectors", nargs="+", required=True, help="task vectors (.safetensors), one per task")
    p.add_argument("-o", "--out", required=True, help="output .parquet: each task's drift and their mean")

    p = add("ace-gates", "diagnose.ace_gates",
            "What ACE-Merging sees in task vectors, per weight matrix and task: its heterogeneity gamma, whether "
            "its gate opens, each task's squared norm and the share of its covariance above the noise floor.")
    p.add_argument("--task-vectors", nargs="+", required=True, help="task vectors (.safetensors), one per task")
    p.add_argument("--gamma-threshold", type=float, default=0.3, help="the gate: gamma above it opens it")
    p.add_argument("--no-conv", dest="include_conv", action="store_false",
                   help="average convolution weights (default: read as (out, in*kh*kw) matrices, as ace does)")
    p.add_argument("-o", "--out", required=True, help="output .parquet: one row per weight matrix and task")

    p = add("linearity", "diagnose.linearity",
            "Joint-task loss linearity (Theorem C.8) per task pair: delta_{s,t}(alpha) = L_JTL(alpha w_s + "
            "(1 - alpha) w_t) - alpha L_JTL(w_s) - (1 - alpha) L_JTL(w_t), L_JTL = L_s + L_t, beside its bound "
            "1/2 alpha (1 - alpha) (lambda_s + lambda_t) ||w_s - w_t||^2 with lambda from a curvature file.")
    p.add_argument("--curvature", required=True,
                   help="the release group's 'dpmerge curvature' file (lambda_max per task)")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--base", required=True, help="pretrained top weights (safetensors)")
    p.add_argument("--task-vectors", nargs="+", required=True, help="task vectors (safetensors), one per task")
    p.add_argument("--heads", nargs="+", required=True, help="one head per task vector, same order")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                   help="points strictly inside (0, 1) of the segment between two task models (default 0.25 0.5 0.75)")
    p.add_argument("--max-examples", type=int, default=64,
                   help="seeded test subsample per task; must match the curvature file's (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("-o", "--out", required=True, help="output .parquet")


def _landscape(add) -> None:
    """The commands of curvature, interpolation and the loss landscape."""
    p = add("curvature", "diagnose.curvature",
            "Per task: sharpness proxy, Hessian lambda_max (power iteration), merge gap and Theorem 5.2's bound.")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--base", required=True, help="pretrained top weights (safetensors)")
    p.add_argument("--merged", required=True, help="merged model (safetensors) the gap is measured to")
    p.add_argument("--task-vectors", nargs="+", required=True, help="task vectors (safetensors), one per task")
    p.add_argument("--heads", nargs="+", required=True, help="one head per task vector, same order")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order")
    p.add_argument("--rho", type=float, default=0.05, help="sharpness radius (default 0.05)")
    p.add_argument("--iterations", type=int, default=20, help="power iterations per lambda_max (default 20)")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="stop a power iteration when lambda changes by less than this, relatively (default 1e-3)")
    p.add_argument("--gammas", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                   help="points of the segment w_t -> w_merge where lambda_max is measured for beta_t "
                        "(first must be 0; default 0 0.5 1)")
    p.add_argument("--max-examples", type=int, default=64, help="seeded test subsample per task (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("-o", "--out", required=True, help="output Parquet, one row per task")

    p = add("interpolate", "diagnose.interpolate", "Loss along (1-gamma) w_t + gamma w_merge per task (paper Fig. 2).")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--merged", required=True, help="merged model .safetensors (gamma = 1)")
    p.add_argument("--task-vectors", nargs="+", required=True, help="task vectors, one per task (gamma = 0)")
    p.add_argument("--heads", nargs="+", required=True, help="one head per task vector, same order")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order")
    p.add_argument("--points", type=int, default=11, help="number of gamma values in [0, 1]")
    p.add_argument("--max-examples", type=int, default=200, help="seeded test subsample per task")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("-o", "--out", required=True,
                   help="output .parquet: loss and score per task and gamma, with each task's barrier")

    p = add("landscape", "diagnose.landscape",
            "2-D loss landscape of a merged model (paper App. B.4, Figs. 4, 5): every task's test loss and their "
            "mean at w_merge + a d1 + b d2, on two filter-normalised random directions (Li et al. 2018) or on "
            "the plane of two task vectors.")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=SPEC_HELP)
    p.add_argument("--base", required=True, help="pretrained top weights w0 (safetensors)")
    p.add_argument("--merged", required=True, help="merged model (safetensors): the centre (0, 0) of the plane")
    p.add_argument("--task-vectors", nargs="+",
                   help="task vectors (safetensors); the first two span the task_vectors plane, the random plane "
                        "does not use them")
    p.add_argument("--heads", nargs="+", required=True, help="one head per task, same order as --data")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files; the mean over these tasks is "
                                                            "the merged model's multi-task loss")
    p.add_argument("--plane", choices=["random", "task_vectors"], default="random",
                   help="random: two filter-normalised Gaussian directions (biases and norm layers unmoved); "
                        "task_vectors: the first two task vectors, unscaled (default random)")
    p.add_argument("--points", type=int, default=9, help="grid points per axis, >= 3 (default 9: 81 points)")
    p.add_argument("--span", type=float, default=1.0,
                   help="each coordinate runs over linspace(-span, span, points) (default 1.0)")
    p.add_argument("--max-examples", type=int, default=64, help="seeded test subsample per task (default 64)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random directions: seed and seed + 1 (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("-o", "--out", required=True,
                   help="output Parquet: per grid point (a, b) one row per task and one of task 'mean'")


def _tables_and_figures(add, figure_outputs) -> None:
    """The commands of the paper's tables and figures."""
    kinds = "; ".join(f"{name} = {text}" for name, text in TABLE_KINDS.items())
    p = add("table", "report.table", f"A paper table (Parquet, Markdown, LaTeX, HTML) from evaluation files: {kinds}. "
                     "Cells are means over seeds, with +- the standard deviation where there are several.")
    p.add_argument("scores", nargs="+", help="evaluation .parquet files ('dpmerge evaluate')")
    p.add_argument("--kind", choices=list(TABLE_KINDS), default="multitask", help="which table (see above)")
    p.add_argument("--operator", default="ties", help="merge the epsilon_sweep, rho and anchor_lambda tables report")
    p.add_argument("--metric-in-header", action="store_true", help="name each task's metric in its column header")
    p.add_argument("--caption", default="", help="caption written above the table")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet, PREFIX.md, PREFIX.tex, PREFIX.html")

    p = add("plot-sharpness-drift", "report.plot_sharpness_drift",
            "Fig. 3: sharpness proxy and reference drift against epsilon, one line per method.")
    p.add_argument("--curvature", nargs="+", required=True, help="curvature .parquet files ('dpmerge curvature')")
    p.add_argument("--drift", nargs="+", required=True, help="drift .parquet files ('dpmerge drift')")
    figure_outputs(p)

    p = add("plot-gap-bound", "report.plot_gap_bound",
            "Measured merge gap against Theorem 5.2's bound and Eq. (3)'s second-order estimate, per task model.")
    p.add_argument("curvature", nargs="+", help="curvature .parquet files ('dpmerge curvature')")
    figure_outputs(p)

    p = add("plot-interpolation", "report.plot_interpolation", "Figure of interpolation curves per task and method.")
    p.add_argument("curves", nargs="+", help="interpolation .parquet files")
    figure_outputs(p)

    p = add("plot-landscape", "report.plot_landscape",
            "Contour figure of loss landscapes (paper Figs. 4, 5): one panel per file, on one shared loss scale.")
    p.add_argument("landscapes", nargs="+", help="landscape .parquet files from 'dpmerge landscape', one per panel")
    figure_outputs(p)


def _answer_and_ledger(add) -> None:
    """The commands of the ledger, the answer page, the signal check and the budget protocol."""
    p = add("ledger", "ledger.ledger", "Collect and check the privacy records of all released task vectors.")
    p.add_argument("task_vectors", nargs="+",
                   help="released task vectors (.safetensors); their privacy records are read from the metadata")
    p.add_argument("-o", "--out", required=True, help="ledger .parquet")
    p.add_argument("--report", required=True, help="ledger check report .md")
    p.add_argument("--statistics", nargs="*", help="merge statistics files (from 'dpmerge statistics')")
    p.add_argument("--statistics-out", help="per-task ledger of merge statistics .parquet")
    p.add_argument("--check-out", help="the check's verdict .json (verdict PASS/FAIL, problems, counts)")
    p.add_argument("--audits", nargs="*", help="audit rows (from 'dpmerge audit' and 'dpmerge audit-merge'): their "
                                               "runs compose with their tasks' releases, and a bound above its "
                                               "claim fails the check")
    p.add_argument("--audits-out", help="ledger of the audits .parquet")
    p.add_argument("--release-log", default=None,
                   help="the study's release log (<results>/private/releases.jsonl): every file is checked against "
                        "it and every release it holds is composed, its file on disk or not (default: none, the "
                        "files alone)")

    p = add("answer", "report.answer", "The study's answer on one page (DP-Merging - DP per backbone and "
                                       "operator, the ablation, "
                      "the ledger's verdict) as Markdown and as the report's front page (.rst).")
    p.add_argument("--table1", nargs="+", action=NamedPaths, dest="tables", required=True, metavar="SETTING=PARQUET",
                   help="Table 1 files, each named by its setting, e.g. 'effnet, eps = 4=results/tables/t.parquet'")
    p.add_argument("--ledger", required=True, help="the privacy ledger's verdict .json ('dpmerge ledger --check-out')")
    p.add_argument("--link", dest="links", nargs="*", default=[], help="files the page points to")
    p.add_argument("--description", help="reStructuredText appended to the report's front page")
    p.add_argument("--audit-table", default=None,
                   help="the audits' table .parquet ('dpmerge audit-report'), summed up in one line (default: none)")
    p.add_argument("--signal-check", default=None,
                   help="the signal check's .parquet ('dpmerge signal-check'), shown on the page (default: none)")
    p.add_argument("--figure", nargs="*", default=[],
                   help="where the forest plot of every cell goes, .png and/or .pdf (default: none drawn)")
    p.add_argument("--out-markdown", required=True, help="answer .md")
    p.add_argument("--out-rst", required=True, help="answer .rst (the report's front page)")

    p = add("signal-check", "report.signal_check", "Does each task's individual model beat chance? Every task's "
            "individual models (own task, per method and budget) against the task's chance level under its metric, "
            "with 95 % t-intervals over seeds, flagging tasks without signal (PREFIX.parquet, .md, .tex).")
    p.add_argument("--scores", nargs="+", required=True, help="individual score files ('dpmerge evaluate')")
    p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet, .md and .tex")
    p.add_argument("--nonprivate-share", type=float, default=0.6,
                   help="share of the way from chance to 100 a non-private model's interval must reach by its "
                        "lower end (default: %(default)s)")
    p.add_argument("--private-share", type=float, default=0.3,
                   help="the same for a private model (default: %(default)s)")

    p = add("select-budget", "report.select_budget", "The training-budget protocol's choice: per backbone kind, "
                                                     "the candidate whose private "
                             "methods' individual models score best on the validation split.")
    p.add_argument("--table1", nargs="+", action=NamedPaths, dest="tables", required=True, metavar="CANDIDATE=PARQUET",
                   help="each candidate's Table 1 (scored on the validation split)")
    p.add_argument("--candidates", required=True, type=json_object,
                   help='JSON {candidate: {"kind": ..., "trainable_blocks": ..., "lr": ..., "epochs": ..., '
                        '"batch_size": ...}}')
    p.add_argument("--seeds", type=int, default=1, help="seeds behind each score (default: %(default)s)")
    p.add_argument("--signal-check", default=None,
                   help="the signal check's .parquet on the validation split: applies the signal criterion")
    p.add_argument("--out-markdown", required=True, help="the choice and every candidate's scores, .md")
    p.add_argument("--out-parquet", required=True, help="the same as .parquet")
