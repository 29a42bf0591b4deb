# Validation, the grid, wildcard constraints and input functions shared by all rules.
import json
import os
import shlex
import sys

# Only the torch-free catalog (dpmerge/catalog.py): building the DAG of a paper preset imports no torch.
from dpmerge.catalog import (
    BACKBONES,
    BASELINE,
    METHODS,
    NEEDS_STATISTICS,
    PROPOSED,
    SWEPT_PARAMETERS,
    ablation_table_caption,
    check_config,
    configured_finetune_settings,
    eps_label,
    epsilon_of_label,
    epsilon_sweep_table_caption,
    gap_bound_figure_title,
    interpolation_figure_title,
    landscape_figure_title,
    merge_hyperparameters as _merge_hyperparameters,
    merge_operator as _merge_operator,
    multitask_table_caption,
    operators_table_caption,
    parse_label,
    sensitivity_table_caption,
    sharpness_drift_figure_title,
    sweep_label,
)

# Before any job: --config's text read by the schema's types (`seeds=[0]` arrives as ['0']), the schema with its
# defaults filled in, and every check it cannot express (dpmerge/config_check.py).
check_config(config)

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


def merge_operator(name):
    return _merge_operator(config, name)


def merge_hyperparameters(name):
    return _merge_hyperparameters(config, name)


def eps_value(label):
    return epsilon_of_label(label)


def eps_labels_for(method):
    return ["epsinf"] if not METHODS[method_of(method)].private else [eps_label(e) for e in config["epsilons"]]


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


# Their shell commands start with `export DPMERGE_GPU_JOB={resources.gpu};`: a job that asked for a GPU claims its
# own from the local pool (dpmerge/gpu_slots.py). Written into each command, since no prefix reads resources.


def backbone_resource(name, default):
    """A job resource (mem_mb, runtime) from the backbone's `resources:` entry, else the rule's default. Memory
    grows with the attempt, so a job retried after running out of memory (profiles/slurm: retries) gets more."""

    def resource(wildcards, attempt):
        value = config["backbones"][wildcards.backbone].get("resources", {}).get(name, default)
        return value * attempt if name == "mem_mb" else value

    return resource


def zeroshot_heads(backbone):
    return BACKBONES[config["backbones"][backbone]["kind"]].zeroshot_heads


def zeroshot_head_input(wildcards):
    return [ZEROSHOT_HEAD.format(**wildcards)] if zeroshot_heads(wildcards.backbone) else []


# Part of prepare's command, not a parameter: where the data lies is not a setting of the result, so moving the
# data directory reruns nothing.
DATA_DIR_ARGUMENT = (
    f"--data-dir {shlex.quote(os.path.abspath(config['data']['dir']))}" if config["data"].get("dir") else ""
)


def finetune_settings(backbone, method):
    return configured_finetune_settings(config, backbone, method)


def finetune_hparams(wildcards):
    """The release group's settings, with the study's privacy settings (how the mechanism draws and which
    neighbouring relation it is calibrated for); a sensitivity label's value overrides them last."""
    settings = finetune_settings(wildcards.backbone, method_of(wildcards.method))
    settings.update(config["privacy"])
    public_n = settings.get("public_n")
    if isinstance(public_n, dict):  # one public size per task (config_check: every task has one)
        settings["public_n"] = public_n[wildcards.task]
    if settings.get("public_n") is None:
        settings.pop("public_n", None)  # absent, as before there was a choice: runs made then are not rerun
    settings.update(sensitivity_override(wildcards.method))
    return json.dumps(settings, sort_keys=True)


def epsilon_argument(wildcards):
    value = eps_value(wildcards.eps)
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


# The study's secret key (dpmerge/study_key.py): created by the first job that needs it, never an output, passed
# by path in commands (not a parameter: where it lies is not a setting of any result).
STUDY_KEY = result("private/study.key")
TV = result("taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
HEAD = result("heads/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
DATA = result("data/{backbone}/{task}.pt")
ZEROSHOT_HEAD = result("zeroshot_heads/{backbone}/{task}.safetensors")
PRETRAINED = result("pretrained/{backbone}.safetensors")
MERGED = result("merged/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
SCORES_INDIVIDUAL = result("scores/individual/{backbone}/{eps}/{method}/{seed}.parquet")
SCORES_MERGED = result("scores/merged/{backbone}/{eps}/{method}/{seed}/{operator}.parquet")
DRIFT = result("diagnostics/drift/{backbone}/{eps}/{method}/{seed}.parquet")
INTERPOLATION = result("diagnostics/interpolation/{backbone}/{eps}/{method}/{seed}.parquet")
CURVATURE = result("diagnostics/curvature/{backbone}/{eps}/{method}/{seed}.parquet")
LANDSCAPE = result("diagnostics/landscape/{backbone}/{eps}/{method}/{seed}.parquet")
LINEARITY = result("diagnostics/linearity/{backbone}/{eps}/{method}/{seed}.parquet")
TABLE1 = result("tables/table1_{backbone}_{eps}")
TABLE4 = result("tables/table4_epsilon_sweep")
TABLE5 = result("tables/table5_ablation_{backbone}_{eps}")
TABLE6 = result("tables/table6_rho_{backbone}")
TABLE7 = result("tables/table7_lambda_{backbone}")
TABLE8 = result("tables/table8_operators_{backbone}_{eps}")
TABLES_INDEX = result("tables/index.md")
FIGURE_INTERPOLATION = result("figures/interpolation_{backbone}_{eps}")
FIGURE_SHARPNESS_DRIFT = result("figures/sharpness_drift_{backbone}")
FIGURE_GAP_BOUND = result("figures/gap_vs_bound_{backbone}")
FIGURE_LANDSCAPE = result("figures/landscape_{backbone}_{eps}")
LEDGER_TABLE = result("privacy/ledger.parquet")
LEDGER_STATISTICS = result("privacy/merge_statistics.parquet")
LEDGER_REPORT = result("privacy/ledger.md")
LEDGER_CHECK = result("privacy/ledger_check.json")  # the check's verdict as data (what the answer page reads)
TABLE_EXTENSIONS = (".parquet", ".md", ".tex", ".html")
FIGURE_EXTENSIONS = (".png", ".pdf")
SWEEPS = config["sweeps"]
TABLE_OPERATOR = config["tables"]["operator"]


# The model diagnostics (curvature, linearity, interpolation) are the DAG's slowest jobs; a study may run them
# on its first seeds only (drift then runs on every seed), or not at all (seeds: 0, the demo's answer needs none
# of them: no drift either, and none of the figures that read them).
_DIAGNOSED = config["diagnostics"].get("seeds")
DIAGNOSTICS = bool(OPERATOR_NAMES) and _DIAGNOSED != 0
DIAGNOSED_SEEDS = (SEEDS if _DIAGNOSED is None else SEEDS[:_DIAGNOSED]) if DIAGNOSTICS else []
# The training-budget protocol (presets/protocol.yaml): individual models scored on a validation split held out
# of each task's training data, no merges, and the choice of budget (rule select_budget).
PROTOCOL = bool(config["data"].get("validation_fraction"))


def release_grid():
    """(backbone, eps, method, seed) of every release group of the main grid: every merge, every diagnostic."""
    return [
        dict(backbone=b, eps=e, method=m, seed=s)
        for b in config["backbones"]
        for m in config["methods"]
        for e in eps_labels_for(m)
        for s in SEEDS
    ]


def _sweep_backbones(sweep):
    return sweep.get("backbones") or list(config["backbones"])


def epsilon_sweep_grid():
    """Release groups the epsilon sweep adds (Table 4, Fig. 3): its budgets not already in the main grid."""
    sweep = SWEEPS.get("epsilon")
    if not sweep:
        return []
    return [
        dict(backbone=b, eps=eps_label(e), method=m, seed=s)
        for b in _sweep_backbones(sweep)
        for m in sweep["methods"]
        for e in sweep["epsilons"]
        if eps_label(e) not in PRIVATE_EPS
        for s in SEEDS
    ]


def sensitivity_epsilon(parameter):
    return eps_label(SWEEPS[parameter].get("epsilon", config["epsilons"][0]))


def sensitivity_grid(parameter):
    """Release groups of one sensitivity sweep (Table 6: rho, Table 7: anchor_lambda). A value equal to the
    method's configured setting is the main grid's run and is not repeated."""
    sweep = SWEEPS.get(parameter)
    if not sweep:
        return []
    method = sweep["method"]
    groups = []
    for b in _sweep_backbones(sweep):
        default = finetune_settings(b, method)[parameter]
        for value in sweep["values"]:
            if float(value) == float(default):
                continue
            label = sweep_label(method, parameter, value)
            groups += [dict(backbone=b, eps=sensitivity_epsilon(parameter), method=label, seed=s) for s in SEEDS]
    return groups


def sweep_merges(parameter):
    """Merges a sweep's groups run: its operators, the tables' operator, and (epsilon sweep) the curvature
    diagnostic's, whose merge gap needs that merge."""
    names = list(SWEEPS[parameter].get("operators", [])) + [TABLE_OPERATOR]
    if parameter == "epsilon":
        names.append(config["diagnostics"]["curvature"]["operator"])
    return list(dict.fromkeys(names))


def all_groups():
    """Every release group with the merges it runs and whether the curvature diagnostic runs on it."""
    groups = [
        dict(g, merges=OPERATOR_NAMES, curvature=g["seed"] in DIAGNOSED_SEEDS)
        for g in release_grid()
        if not head_only(g["method"])
    ]
    # The Pretrained row's runs (w0 + a DP head): their task vectors are zero, so there is nothing to merge or
    # diagnose; only their individual scores are read
    groups += [dict(g, merges=[], curvature=False) for g in release_grid() if head_only(g["method"])]
    groups += [
        dict(g, merges=sweep_merges("epsilon"), curvature=g["seed"] in DIAGNOSED_SEEDS) for g in epsilon_sweep_grid()
    ]
    for parameter in SENSITIVITY_LABELS:
        groups += [dict(g, merges=sweep_merges(parameter), curvature=False) for g in sensitivity_grid(parameter)]
    return groups + noise_extra_groups(groups)  # workflow/rules/noise_common.smk


def head_only(method):
    return METHODS[method_of(method)].head_only


def all_task_vectors():
    return [TV.format(task=t, **g) for g in all_groups() for t in config["backbones"][g["backbone"]]["tasks"]]


def table_groups(wildcards):
    """Release groups shown for one (backbone, eps): that epsilon's, plus the non-private reference if run."""
    return [g for g in release_grid() if g["backbone"] == wildcards.backbone and g["eps"] in (wildcards.eps, "epsinf")]


def table_scores(wildcards):
    """Every score file a (backbone, eps) table reads: individual and merged, all methods and seeds."""
    groups = table_groups(wildcards)
    files = [SCORES_INDIVIDUAL.format(**g) for g in groups]
    files += [
        SCORES_MERGED.format(operator=o, **g) for g in groups for o in OPERATOR_NAMES if not head_only(g["method"])
    ]
    return files


def table_curves(wildcards):
    return [
        INTERPOLATION.format(**g)
        for g in table_groups(wildcards)
        if g["seed"] in DIAGNOSED_SEEDS and not head_only(g["method"])
    ]


# Each paper table is built where the configured grid holds its inputs, and otherwise listed with the reason in
# tables/index.md (and the workflow's log) instead of failing the run.
# Table 5 needs its two-query rows; DPSAT's one-query rows join it when configured
ABLATION_METHODS = tuple(m for m, spec in METHODS.items() if spec.ablation_row and not spec.one_query)
ONE_QUERY_FLATNESS_METHODS = tuple(m for m, spec in METHODS.items() if spec.ablation_row and spec.one_query)
COMPARED_METHODS = (BASELINE, PROPOSED)


def _missing_methods(needed):
    return [m for m in needed if m not in config["methods"]]


def epsilon_sweep_scores():
    """Table 4's inputs: the tables operator's merged scores of naive DP and DP-Merging at every budget."""
    groups = [g for g in release_grid() + epsilon_sweep_grid() if g["method"] in COMPARED_METHODS]
    return [SCORES_MERGED.format(operator=TABLE_OPERATOR, **g) for g in groups]


def sensitivity_scores(parameter, backbone):
    eps = sensitivity_epsilon(parameter)
    method = SWEEPS[parameter]["method"]
    groups = [g for g in sensitivity_grid(parameter) if g["backbone"] == backbone]
    groups += [
        g
        for g in release_grid()
        if g["backbone"] == backbone and g["eps"] == eps and g["method"] in (method, "naive_dp")
    ]
    return [SCORES_MERGED.format(operator=TABLE_OPERATOR, **g) for g in groups]


def _sensitivity_values(parameter, backbone):
    """Distinct values of `parameter` the table would show: the sweep's and the main run's."""
    method = SWEEPS[parameter]["method"]
    values = {float(finetune_settings(backbone, method)[parameter])} if method in config["methods"] else set()
    values |= {
        sensitivity_override(g["method"])[parameter] for g in sensitivity_grid(parameter) if g["backbone"] == backbone
    }
    return values


def planned_tables():
    """({table prefix: (rule, wildcards)}, [(table, reason skipped)]) for the configured grid."""
    planned, skipped = {}, []
    for b in config["backbones"]:
        for e in PRIVATE_EPS:
            planned[TABLE1.format(backbone=b, eps=e)] = "table1"
            if not OPERATOR_NAMES:
                skipped.append((f"Tables 5 and 8, {b}, {e}", "no merges configured (the budget protocol)"))
                continue
            if missing := _missing_methods(ABLATION_METHODS):
                skipped.append((f"Table 5 (ablation), {b}, {e}", f"methods lack {', '.join(missing)}"))
            else:
                planned[TABLE5.format(backbone=b, eps=e)] = "table5"
            if missing := _missing_methods(COMPARED_METHODS):
                skipped.append((f"Table 8 (operators), {b}, {e}", f"methods lack {', '.join(missing)}"))
            else:
                planned[TABLE8.format(backbone=b, eps=e)] = "table8"
    groups = release_grid() + epsilon_sweep_grid()
    budgets = {
        b: set.intersection(
            *({g["eps"] for g in groups if g["backbone"] == b and g["method"] == m} for m in COMPARED_METHODS)
        )
        for b in config["backbones"]
    }
    if max(len(found) for found in budgets.values()) < 2:
        skipped.append(
            (
                "Table 4 (epsilon sweep)",
                "no backbone has naive_dp and dp_merging at two or more budgets; add epsilons or sweeps.epsilon",
            )
        )
    else:
        planned[TABLE4] = "table4"
    for parameter, prefix, name in (("rho", TABLE6, "Table 6 (rho)"), ("anchor_lambda", TABLE7, "Table 7 (lambda)")):
        for b in config["backbones"]:
            if parameter not in SWEEPS:
                skipped.append((f"{name}, {b}", f"no sweeps.{parameter} configured"))
            elif b not in _sweep_backbones(SWEEPS[parameter]):
                skipped.append((f"{name}, {b}", f"sweeps.{parameter}.backbones leaves {b} out"))
            elif len(_sensitivity_values(parameter, b)) < 2:
                skipped.append((f"{name}, {b}", f"fewer than two values of {parameter}"))
            else:
                planned[prefix.format(backbone=b)] = "table6" if parameter == "rho" else "table7"
    return planned, skipped


PLANNED_TABLES, SKIPPED_TABLES = planned_tables()
PROTOCOL_CHOICE = result("protocol/choice.md")
ANSWER = result("answer.md")
ANSWER_RST = result("answer.rst")


def answer_tables():
    """SETTING=PARQUET of every Table 1, for the answer page."""
    return {
        f"{b}, ε = {epsilon_of_label(e):g}": f"{TABLE1.format(backbone=b, eps=e)}.parquet"
        for b in config["backbones"]
        for e in PRIVATE_EPS
    }


def protocol_tables():
    """Candidate (configured backbone) -> its Table 1 Parquet at the protocol's budget."""
    return {b: f"{TABLE1.format(backbone=b, eps=PRIVATE_EPS[0])}.parquet" for b in config["backbones"]}


def protocol_candidates():
    """Each configured backbone is one candidate setting of the protocol: its kind, trainable blocks and the
    private methods' fine-tuning settings."""
    candidates = {}
    for b, entry in config["backbones"].items():
        settings = finetune_settings(b, "naive_dp")
        candidates[b] = {
            "kind": entry["kind"],
            "trainable_blocks": entry.get("trainable_blocks"),
            **{k: settings.get(k) for k in ("lr", "epochs", "batch_size")},
        }
    return candidates


def answer_links():
    tables = [f"{prefix}.html" for prefix in PLANNED_TABLES]
    audits = [f"{AUDIT_TABLE}.md" for _ in answer_audit_table()]  # workflow/rules/audit_common.smk
    return tables + [f"{prefix}.png" for prefix in all_figures()] + [LEDGER_REPORT] + audits


for _table, _reason in SKIPPED_TABLES:
    print(f"dpmerge: skipping {_table}: {_reason}", file=sys.stderr)


def landscape_groups(backbone, eps):
    methods = [m for m in config["diagnostics"]["landscape"]["methods"] if m in config["methods"]]
    return [dict(backbone=backbone, eps=eps, method=m, seed=SEEDS[0]) for m in methods]


def landscape_files(wildcards):
    return [LANDSCAPE.format(**g) for g in landscape_groups(wildcards.backbone, wildcards.eps)]


def backbone_curvature(wildcards):
    return [CURVATURE.format(**g) for g in all_groups() if g["curvature"] and g["backbone"] == wildcards.backbone]


def backbone_drift(wildcards):
    return [DRIFT.format(**g) for g in all_groups() if g["curvature"] and g["backbone"] == wildcards.backbone]


def all_figures():
    figures = []
    if not DIAGNOSTICS:  # every figure here reads a diagnostic
        return figures
    for b in config["backbones"]:
        figures.append(FIGURE_GAP_BOUND.format(backbone=b))
        if any(METHODS[method_of(g["method"])].private for g in all_groups() if g["backbone"] == b):
            figures.append(FIGURE_SHARPNESS_DRIFT.format(backbone=b))  # its x axis is epsilon
        for e in PRIVATE_EPS:
            figures.append(FIGURE_INTERPOLATION.format(backbone=b, eps=e))
            if landscape_groups(b, e):
                figures.append(FIGURE_LANDSCAPE.format(backbone=b, eps=e))
    return figures


def all_targets():
    targets = [LEDGER_REPORT, TABLES_INDEX]
    targets += [PROTOCOL_CHOICE] if PROTOCOL else []
    targets += [ANSWER, ANSWER_RST] if OPERATOR_NAMES else []
    for g in all_groups():
        if g["merges"] and DIAGNOSTICS:
            targets.append(DRIFT.format(**g))
        if g["curvature"]:
            targets += [CURVATURE.format(**g), LINEARITY.format(**g)]
        targets += [SCORES_MERGED.format(operator=o, **g) for o in g["merges"]]
    for prefix in PLANNED_TABLES:
        targets += [prefix + ext for ext in TABLE_EXTENSIONS]
    for prefix in all_figures():
        targets += [prefix + ext for ext in FIGURE_EXTENSIONS]
    return targets + audit_targets() + mix_targets() + noise_targets()  # audit_common, mix_common, noise_common


def operator_params(wildcards):
    """The merge's operator, vectors, hyperparameters and statistics file as flags (a change reruns only this
    merge onwards)."""
    name = wildcards.operator
    flags = [
        f"--method {merge_operator(name)}",
        f"--vectors {config['merge'][name].get('vectors', 'task')}",
        f"--name {name}",
    ]
    flags += [f"--param {key}={json.dumps(value)}" for key, value in sorted(merge_hyperparameters(name).items())]
    flags += [f"--statistics {path}" for path in merge_statistics_files(wildcards)]
    return " ".join(flags)


STATISTICS = result("statistics/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")


def merge_statistics_files(wildcards):
    """The statistics a merge reads (RegMean, Fisher), or none."""
    if merge_operator(wildcards.operator) not in NEEDS_STATISTICS:
        return []
    return [STATISTICS.format(**wildcards)]


def statistics_params(wildcards):
    name = wildcards.operator
    settings = config["merge"][name]["statistics"]
    flags = [
        f"--kind {NEEDS_STATISTICS[merge_operator(name)]}",
        f"--source {settings['data']}",
        f"--examples {settings.get('examples', 256)}",
    ]
    if settings["data"] == "private":
        flags += [f"--clip-norm {settings['clip_norm']}", f"--epsilon {settings['epsilon']}"]
    return " ".join(flags)


def public_data_input(wildcards):
    """The prepared dataset a backbone declares public, for merges whose statistics read public data."""
    if config["merge"][wildcards.operator]["statistics"]["data"] != "public":
        return []
    return [DATA.format(backbone=wildcards.backbone, task=config["backbones"][wildcards.backbone]["public_data"])]


def public_data_flag(wildcards, input):
    return f"--public-data {input.public}" if input.public else ""


def all_statistics():
    return [
        STATISTICS.format(operator=name, **g)
        for g in all_groups()
        for name in g["merges"]
        if merge_operator(name) in NEEDS_STATISTICS
    ]


def interpolation_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["interpolation"]["operator"], **wildcards)


def curvature_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["curvature"]["operator"], **wildcards)


def landscape_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["landscape"]["operator"], **wildcards)
