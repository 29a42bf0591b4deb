# The study's settings: the configuration validated, the results folder, wildcard constraints, and each job's
# settings (backbone, fine-tuning, budget, seed) as its rules pass them. Everything below it reads these names.
import json
import os
import re
import shlex
import sys
from types import SimpleNamespace

# Only the torch-free catalog (dpmerge/catalog.py): building the DAG of a paper preset imports no torch.
from dpmerge.catalog import (
    BACKBONES,
    BASELINE,
    ConfigError,
    METHODS,
    NEEDS_STATISTICS,
    PROPOSED,
    SWEPT_PARAMETERS,
    NONPRIVATE_LABEL,
    ablation_table_caption,
    audit_run_settings,
    backbone_settings,
    changed_settings,
    check_config,
    eps_label,
    finetune_settings,
    epsilon_of_label,
    epsilon_sweep_table_caption,
    gap_bound_figure_title,
    interpolation_figure_title,
    landscape_figure_title,
    merge_hyperparameters,
    merge_operator,
    multitask_table_caption,
    operators_table_caption,
    parse_label,
    run_settings,
    sampling_limits,
    sensitivity_table_caption,
    sharpness_drift_figure_title,
    statistics_settings,
    sweep_label,
)

# Before any job: --config's text read by the schema's types (`seeds=[0]` arrives as ['0']), the schema with its
# defaults filled in, and every check it cannot express (dpmerge/config_check.py).
# every own task's data is read whole once, by the main process (each job parses the config again)
check_config(config, read_own_data=workflow.is_main_process)

RESULTS = config["results"]

# Rules call the `dpmerge` command installed beside the Python that runs Snakemake (e.g. .venv/bin), also when
# the virtual environment was not activated (under --sdm conda, the activated env's bin comes first). A write,
# not a variable the user must set, so no `envvars:`: that would also export this host's PATH to cluster jobs,
# which prepend their own.
os.environ.update(PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))

# Every rule's software under --sdm conda. Snakemake reads a rule's `conda:` path relative to the file that
# defines the rule: all of them are in workflow/rules/.
DPMERGE_ENV = "../../envs/dpmerge.yaml"


def result(path):
    """A path under the configured results folder."""
    return f"{RESULTS}/{path}"


def operator_of(name):
    """The merge operator a configured merge runs (a merge's name may differ from its operator's)."""
    return merge_operator(config, name)


def hyperparameters_of(name):
    return merge_hyperparameters(config, name)


def eps_labels_for(method):
    return [NONPRIVATE_LABEL] if not METHODS[method_of(method)].private else [eps_label(e) for e in config["epsilons"]]


# Sensitivity sweeps (Tables 6, 7) fine-tune a method again at other values of one hyperparameter; the release
# group's label carries the value ("dp_merging-rho0.1"), the task vectors record it, the default run keeps the
# plain method name.
SENSITIVITY_LABELS = SWEPT_PARAMETERS


def method_of(label):
    return parse_label(label)[0]


def sensitivity_override(label):
    return parse_label(label)[1]


PRIVATE_EPS = [eps_label(e) for e in config["epsilons"]]
SEEDS = [f"s{s}" for s in config["seeds"]]


def seeds_of(backbone):
    """The seeds every release group of a backbone runs at: its own `seeds` where it sets them (a backbone whose
    merged scores vary more between seeds needs more of them for the same interval), else the study's."""
    own = config["backbones"][backbone].get("seeds")
    return SEEDS if own is None else [f"s{s}" for s in own]


ALL_SEEDS = list(dict.fromkeys(s for b in config["backbones"] for s in seeds_of(b)))
OPERATOR_NAMES = list(config["merge"])


wildcard_constraints:
    backbone="[A-Za-z0-9-]+",
    task="[a-z0-9_]+",
    eps=r"eps(inf|[0-9.]+)",
    method="(?:" + "|".join(METHODS) + ")(?:-(?:" + "|".join(SENSITIVITY_LABELS.values()) + ")[0-9][0-9.e+-]*)?",
    seed=r"s[0-9]+",
    operator="|".join(sorted(config["merge"], key=len, reverse=True)),


COMPUTE_DEFAULTS = {"device": "cpu", "precision": "fp32"}


def compute_settings(backbone):
    """Device and precision of a backbone's jobs: config `compute`, overridden by the backbone's entry."""
    entry = config["backbones"][backbone]
    return {key: entry.get(key, config["compute"].get(key, default)) for key, default in COMPUTE_DEFAULTS.items()}


def weights_spec(wildcards):
    """Only the fields that matter for this kind's weights, so an unrelated default never reruns its jobs."""
    entry = config["backbones"][wildcards.backbone]
    relevant = BACKBONES[entry["kind"]].options
    spec = {"kind": entry["kind"], **{k: v for k, v in entry.items() if k in relevant}}
    return json.dumps(spec, sort_keys=True)


def backbone_spec(wildcards):
    """The weights' spec plus where the job runs; default settings are left out, so runs made before there was
    a choice keep their parameters (and are not rerun)."""
    spec = json.loads(weights_spec(wildcards))
    spec.update({k: v for k, v in compute_settings(wildcards.backbone).items() if v != COMPUTE_DEFAULTS[k]})
    return json.dumps(spec, sort_keys=True)


def gpus(wildcards):
    """`resources: gpu` of a backbone's network jobs: one GPU unless it runs on the CPU."""
    return 0 if compute_settings(wildcards.backbone)["device"] == "cpu" else 1


# A network job's shell command starts with this: a job that asked for a GPU claims its own from the local pool
# (dpmerge/gpu_slots.py). Part of each command's text (Snakemake's shell prefix cannot read a job's resources).
GPU_JOB = "export DPMERGE_GPU_JOB={resources.gpu}; "


def backbone_resource(name, default):
    """A job resource (mem_mb, runtime) from the backbone's `resources:` entry, else the rule's default. Memory
    grows with the attempt, so a job retried after running out of memory (profiles/slurm: retries) gets more."""

    def resource(wildcards, attempt):
        value = config["backbones"][wildcards.backbone].get("resources", {}).get(name, default)
        return value * attempt if name == "mem_mb" else value

    return resource


def zeroshot_heads(backbone):
    return BACKBONES[config["backbones"][backbone]["kind"]].zeroshot_heads


# Part of prepare's command, not a parameter: where the data lies is not a setting of the result, so moving the
# data directory reruns nothing.
DATA_DIR_ARGUMENT = (
    f"--data-dir {shlex.quote(os.path.abspath(config['data']['dir']))}" if config["data"].get("dir") else ""
)

# A researcher's own tasks (config own_tasks, dpmerge/data/own.py): their files are the prepare job's inputs, so
# editing the data reruns what read it; their paths are handed over absolute, as the data directory's are.
OWN_TASKS = config.get("own_tasks") or {}
OWN_TASK_PATHS = ("images", "table", "dataset", "test")


def own_task_files(wildcards):
    entry = OWN_TASKS.get(wildcards.task) or {}
    return [entry[key] for key in OWN_TASK_PATHS if key in entry]


def own_task_argument(wildcards):
    entry = OWN_TASKS.get(wildcards.task)
    if entry is None:
        return ""
    absolute = {key: os.path.abspath(value) if key in OWN_TASK_PATHS else value for key, value in entry.items()}
    return f"--own-task {shlex.quote(json.dumps(absolute, sort_keys=True))}"


def finetune_settings_of(backbone, method, task=None):
    return finetune_settings(config, backbone, method, task)


def sampling_limits_of(wildcards):
    """A task's largest batch size and delta, which `prepare` holds against the N it reads (a resource, not a
    param: the check changes no output, so it reruns nothing)."""
    limits = sampling_limits(config, wildcards.backbone, wildcards.task)
    return json.dumps(limits, sort_keys=True, separators=(",", ":"))


def finetune_hparams(wildcards):
    """The release group's settings, with the study's privacy settings (how the mechanism draws and which
    neighbouring relation it is calibrated for); a sensitivity label's value overrides them last."""
    settings = finetune_settings_of(wildcards.backbone, method_of(wildcards.method), wildcards.task)
    # whether a logged release may be replaced is the workflow's permission, not a setting of the mechanism
    settings.update({k: v for k, v in config["privacy"].items() if k != "replace_releases"})
    public_n = settings.get("public_n")
    if isinstance(public_n, dict):  # one public size per task (config_check: every task has one)
        settings["public_n"] = public_n[wildcards.task]
    if settings.get("public_n") is None:
        settings.pop("public_n", None)  # absent, as before there was a choice: runs made then are not rerun
    settings.update(sensitivity_override(wildcards.method))
    return json.dumps(settings, sort_keys=True)


def epsilon_argument(wildcards):
    value = epsilon_of_label(wildcards.eps)
    return "" if value is None else f"--epsilon {value}"


def seed_number(wildcards):
    return int(wildcards.seed.removeprefix("s"))


def tasks_of(wildcards):
    return config["backbones"][wildcards.backbone]["tasks"]


def output_prefix(wildcards, output):
    """A table's --out-prefix, from its job's own outputs: it follows them wherever they are stored (e.g. a
    storage plugin's local copy), where a fixed path would not."""
    return output.parquet.removesuffix(".parquet")


def per_task(pattern):
    """Input function: `pattern` expanded over the backbone's tasks, other wildcards from the job."""

    def inputs(wildcards):
        return [pattern.format(task=task, **wildcards) for task in tasks_of(wildcards)]

    return inputs
