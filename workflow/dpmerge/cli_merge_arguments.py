"""The merge and scoring commands' arguments (`dpmerge merge`, `evaluate`, `score-group`), kept apart from
cli_arguments.py, which builds the rest of the parser and calls add_merge_and_score_commands. Torch-free: the
operators listed in `merge --help` come from merge/specs.py (standard library only).
"""

from __future__ import annotations

from dpmerge.cli_types import KeyValues, NamedPaths, json_object


def add_merge_and_score_commands(add, spec_help: str) -> None:
    """`add(name, stage, description)` makes one subcommand (cli_arguments.build_parser's helper)."""
    from dpmerge.merge.specs import SPECS

    ops = "; ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in op.defaults.items()) or 'no hyperparameters'})"
                    for name, op in SPECS.items())
    p = add("merge", "merge.merge", f"Merge released task vectors. Operators (hyperparameter=default): {ops}.")
    p.add_argument("task_vectors", nargs="+",
                   help="task vectors: .safetensors files, sharded checkpoints (*.safetensors.index.json) or model "
                        "folders ('dpmerge task-vector' makes one from a pretrained and a fine-tuned checkpoint)")
    p.add_argument("--method", dest="operator", required=True, help="merge operator name (listed above)")
    p.add_argument("--vectors", choices=["task", "difference"], default="task",
                   help="merge the task vectors tau_t, or the difference vectors tau_t - mean(tau) around the "
                        "weight average (the result is then the average plus the merged differences); default task")
    p.add_argument("--name", help="label of this merge in scores and tables (default: the method, with "
                                  "'_difference' appended for difference vectors)")
    p.add_argument("--base", required=True,
                   help="pretrained w0: from 'dpmerge pretrained', or any checkpoint (file, sharded index, model "
                        "folder) holding every tensor of the vectors; its other tensors pass through unchanged")
    p.add_argument("--param", action=KeyValues, dest="params", default={},
                   help="operator hyperparameter key=value (repeatable)")
    p.add_argument("-o", "--out", help="merged model .safetensors, with the merge's record in its metadata "
                                       "(give -o, --output-model or both)")
    p.add_argument("--output-model", default=None,
                   help="also (or instead) write w0 + merged vector in the base's layout: a model folder as base "
                        "gives a new folder with its config, tokenizer and shards, loadable by from_pretrained")

    p.add_argument("--statistics", help="per-task data statistics for regmean / fisher (from 'dpmerge statistics')")
    p.add_argument("--require-privacy-record", action="store_true",
                   help="refuse task vectors without a full privacy record (default: merge them, warn on stderr "
                        "and record 'privacy: none recorded'; the pipeline always passes this)")
    p.add_argument("--allow-single", action="store_true",
                   help="accept one task vector (default: refuse, a merge of one is usually a mistaken glob)")

    p = add("evaluate", "evaluate.evaluate",
            "Score every individual (w0 + tau_t) or merged model on every task's test set.")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--merged", help="merged model .safetensors (omit to evaluate the individual task vectors)")
    p.add_argument("--task-vectors", nargs="*", help="task vectors, one per task (individual evaluation)")
    p.add_argument("--own-task-only", action="store_true",
                   help="individual evaluation: each task model on its own task only (default: on every task)")
    p.add_argument("--heads", nargs="+", required=True, help="task heads, one per task")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order as --heads")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("-o", "--out", required=True, help="output .parquet")

    p = add("score-group", "group.score_group",
            "Score one release group in one process: every individual model w0 + tau_t on its own task (or every "
            "task) and, for each data-free merge named in --merges, the merged model made (as 'dpmerge merge' "
            "makes it) and scored on every task. The files are those of 'dpmerge evaluate' and 'dpmerge merge'; "
            "the backbone and the tasks' data are loaded once.")
    p.add_argument("--backbone-spec", required=True, type=json_object, help=spec_help)
    p.add_argument("--base", required=True, help="pretrained w0 .safetensors")
    p.add_argument("--task-vectors", nargs="+", required=True, help="the release group's task vectors, one per task")
    p.add_argument("--heads", nargs="+", required=True, help="their task heads, same order")
    p.add_argument("--data", nargs="+", required=True, help="prepared task files, same order")
    p.add_argument("--own-task-only", action="store_true",
                   help="each individual model on its own task only (default: on every task)")
    p.add_argument("--individual-out", required=True, help="the individual models' scores (.parquet)")
    p.add_argument("--merges", type=json_object, default={},
                   help='the merges as JSON, {NAME: {"method": OPERATOR, "vectors": "task", "params": {...}}}, '
                        "operators that read no data statistics (see 'dpmerge merge --help')")
    p.add_argument("--merged", nargs="+", action=NamedPaths, default={},
                   help="NAME=PATH: each merge's merged model .safetensors")
    p.add_argument("--scores", nargs="+", action=NamedPaths, default={},
                   help="NAME=PATH: each merged model's scores (.parquet)")
    p.add_argument("--require-privacy-record", action="store_true",
                   help="refuse task vectors without a full privacy record (the pipeline always passes this)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
