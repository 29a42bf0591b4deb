# Validation, the grid, wildcard constraints and input functions shared by all rules.
import json
import os
import sys

from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

from dpmerge.backbones import BACKBONES
from dpmerge.methods import METHODS
from dpmerge.merging import NEEDS_STATISTICS, OPERATORS
from dpmerge.tasks import TASKS

RESULTS = config["results"]

# Rules call the `dpmerge` command installed beside the Python that runs Snakemake (e.g. .venv/bin), also when
# the virtual environment was not activated.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def result(path):
    """A path under the configured results folder."""
    return f"{RESULTS}/{path}"


def _config_error(message):
    raise ValueError(f"config error: {message}")


for _name, _backbone in config["backbones"].items():
    _modality = BACKBONES[_backbone["kind"]].modality
    for _task in _backbone["tasks"]:
        if _task not in TASKS:
            _config_error(f"backbones.{_name}.tasks: unknown task {_task!r}; known tasks: {', '.join(sorted(TASKS))}")
        if TASKS[_task].modality != _modality:
            _config_error(
                f"backbones.{_name}.tasks: {_task!r} is a {TASKS[_task].modality} task, "
                f"but {_backbone['kind']!r} is a {_modality} backbone"
            )
_MERGE_META_KEYS = ("operator", "vectors", "statistics")


def merge_operator(name):
    return config["merge"][name].get("operator", name)


def merge_hyperparameters(name):
    return {k: v for k, v in config["merge"][name].items() if k not in _MERGE_META_KEYS}


for _name in config["merge"]:
    if merge_operator(_name) not in OPERATORS:
        _config_error(
            f"merge.{_name}: no operator named {merge_operator(_name)!r}; give `operator:` one of "
            f"{', '.join(OPERATORS)}"
        )
    _statistics = config["merge"][_name].get("statistics")
    if merge_operator(_name) in NEEDS_STATISTICS:
        if _statistics is None:
            _config_error(
                f"merge.{_name}: {merge_operator(_name)} needs data statistics; add statistics: "
                "{data: public} (examples held out of private training, see data.public_examples) or "
                "{data: private, clip_norm: C, epsilon: E} (privatized, composed with each task's budget)"
            )
        if _statistics["data"] == "public" and not config["data"]["public_examples"]:
            _config_error(f"merge.{_name}.statistics.data: public needs data.public_examples > 0")
        if _statistics["data"] == "private" and not {"clip_norm", "epsilon"} <= set(_statistics):
            _config_error(f"merge.{_name}.statistics: data: private needs clip_norm and epsilon")
    elif _statistics is not None:
        _config_error(f"merge.{_name}.statistics: {merge_operator(_name)} uses no data statistics")
    _defaults = OPERATORS[merge_operator(_name)].defaults
    _unknown = set(merge_hyperparameters(_name)) - set(_defaults)
    if _unknown:
        _config_error(
            f"merge.{_name}: unknown hyperparameter(s) {sorted(_unknown)} for operator "
            f"{merge_operator(_name)!r}; allowed: {', '.join(_defaults) or 'none'}"
        )
def _finetune_settings_schema():
    """The schema of one level of finetune settings: the global finetune properties without by_method."""
    import yaml

    with open(os.path.join(workflow.current_basedir, "../schemas/config.schema.yaml")) as handle:
        properties = dict(yaml.safe_load(handle)["properties"]["finetune"]["properties"])
    properties.pop("by_method")
    return {"type": "object", "additionalProperties": False, "properties": properties}


_FINETUNE_SETTINGS_SCHEMA = _finetune_settings_schema()


def _check_finetune_overrides(where, overrides):
    import jsonschema

    try:
        jsonschema.validate(overrides, _FINETUNE_SETTINGS_SCHEMA)
    except jsonschema.ValidationError as error:
        field = ".".join(str(p) for p in error.absolute_path)
        _config_error(f"{where}{'.' + field if field else ''}: {error.message}")


for _method, _overrides in config["finetune"]["by_method"].items():
    _check_finetune_overrides(f"finetune.by_method.{_method}", _overrides)
for _name, _backbone in config["backbones"].items():
    _entry = dict(_backbone.get("finetune", {}))
    _by_method = _entry.pop("by_method", {})
    _check_finetune_overrides(f"backbones.{_name}.finetune", _entry)
    for _method, _overrides in _by_method.items():
        if _method not in METHODS:
            _config_error(f"backbones.{_name}.finetune.by_method: unknown method {_method!r}; known: {', '.join(METHODS)}")
        _check_finetune_overrides(f"backbones.{_name}.finetune.by_method.{_method}", _overrides)
for _diagnostic in ("interpolation", "curvature"):
    _target = config["diagnostics"][_diagnostic]["operator"]
    if _target not in config["merge"]:
        _config_error(
            f"diagnostics.{_diagnostic}.operator: {_target!r} is not among the configured merge operators "
            f"({', '.join(config['merge'])})"
        )
    if OPERATORS[merge_operator(_target)].parts_layout is not None:
        _config_error(
            f"diagnostics.{_diagnostic}.operator: {_target!r} gives one model per task, not one merged model"
        )
if config["diagnostics"]["curvature"]["gammas"][0] != 0:
    _config_error("diagnostics.curvature.gammas: the first point must be 0 (the task model itself)")
for _name in config["merge"]:
    if OPERATORS[merge_operator(_name)].task_vectors_only and config["merge"][_name].get("vectors") == "difference":
        _config_error(f"merge.{_name}.vectors: {merge_operator(_name)} is defined on task vectors only")


def eps_label(epsilon):
    """One canonical spelling per epsilon: 4 and 4.0 are both 'eps4'."""
    value = float(epsilon)
    return f"eps{int(value)}" if value.is_integer() else f"eps{value:g}"


def eps_value(label):
    return None if label == "epsinf" else float(label.removeprefix("eps"))


def eps_labels_for(method):
    return ["epsinf"] if not METHODS[method].private else [eps_label(e) for e in config["epsilons"]]


PRIVATE_EPS = [eps_label(e) for e in config["epsilons"]]
SEEDS = [f"s{s}" for s in config["seeds"]]
OPERATOR_NAMES = list(config["merge"])


wildcard_constraints:
    backbone="[A-Za-z0-9-]+",
    task="[a-z0-9_]+",
    eps=r"eps(inf|[0-9.]+)",
    method="|".join(METHODS),
    seed=r"s[0-9]+",
    operator="|".join(sorted(config["merge"], key=len, reverse=True)),


def backbone_spec(wildcards):
    """Only the fields that matter for this kind, so an unrelated default never reruns its jobs."""
    entry = config["backbones"][wildcards.backbone]
    relevant = BACKBONES[entry["kind"]].options
    spec = {"kind": entry["kind"], **{k: v for k, v in entry.items() if k in relevant}}
    return json.dumps(spec, sort_keys=True)


def finetune_hparams(wildcards):
    """Global settings < global by_method[method] < backbone's finetune < backbone's by_method[method]."""
    merged = {}
    for level in (config["finetune"], config["backbones"][wildcards.backbone].get("finetune", {})):
        level = dict(level)
        by_method = level.pop("by_method", {})
        merged.update(level)
        merged.update(by_method.get(wildcards.method, {}))
    return json.dumps(merged, sort_keys=True)


def epsilon_argument(wildcards):
    value = eps_value(wildcards.eps)
    return "" if value is None else f"--epsilon {value}"


def seed_number(wildcards):
    return int(wildcards.seed.removeprefix("s"))


def tasks_of(wildcards):
    return config["backbones"][wildcards.backbone]["tasks"]


def per_task(pattern):
    """Input function: `pattern` expanded over the backbone's tasks, other wildcards from the job."""

    def inputs(wildcards):
        return [pattern.format(task=task, **wildcards) for task in tasks_of(wildcards)]

    return inputs


TV = result("taskvectors/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
HEAD = result("heads/{backbone}/{eps}/{method}/{seed}/{task}.safetensors")
DATA = result("data/{backbone}/{task}.pt")
PRETRAINED = result("pretrained/{backbone}.safetensors")
MERGED = result("merged/{backbone}/{eps}/{method}/{seed}/{operator}.safetensors")
SCORES_INDIVIDUAL = result("scores/individual/{backbone}/{eps}/{method}/{seed}.parquet")
SCORES_MERGED = result("scores/merged/{backbone}/{eps}/{method}/{seed}/{operator}.parquet")
DRIFT = result("diagnostics/drift/{backbone}/{eps}/{method}/{seed}.parquet")
INTERPOLATION = result("diagnostics/interpolation/{backbone}/{eps}/{method}/{seed}.parquet")
CURVATURE = result("diagnostics/curvature/{backbone}/{eps}/{method}/{seed}.parquet")
TABLE1 = result("tables/table1_{backbone}_{eps}")
FIGURE_INTERPOLATION = result("figures/interpolation_{backbone}_{eps}")
LEDGER_TABLE = result("privacy/ledger.parquet")
LEDGER_STATISTICS = result("privacy/merge_statistics.parquet")
LEDGER_REPORT = result("privacy/ledger.md")


def release_grid():
    """(backbone, eps, method, seed) of every release group in the config."""
    return [
        dict(backbone=b, eps=e, method=m, seed=s)
        for b in config["backbones"]
        for m in config["methods"]
        for e in eps_labels_for(m)
        for s in SEEDS
    ]


def all_task_vectors():
    return [
        TV.format(task=t, **g) for g in release_grid() for t in config["backbones"][g["backbone"]]["tasks"]
    ]


def table_groups(wildcards):
    """Release groups shown for one (backbone, eps): that epsilon's, plus the non-private reference if run."""
    return [
        g
        for g in release_grid()
        if g["backbone"] == wildcards.backbone and g["eps"] in (wildcards.eps, "epsinf")
    ]


def table_scores(wildcards):
    """Every score file a (backbone, eps) table reads: individual and merged, all methods and seeds."""
    groups = table_groups(wildcards)
    files = [SCORES_INDIVIDUAL.format(**g) for g in groups]
    files += [SCORES_MERGED.format(operator=o, **g) for g in groups for o in OPERATOR_NAMES]
    return files


def table_curves(wildcards):
    return [INTERPOLATION.format(**g) for g in table_groups(wildcards)]


def all_targets():
    targets = [LEDGER_REPORT]
    for g in release_grid():
        targets.append(DRIFT.format(**g))
        targets.append(CURVATURE.format(**g))
    for b in config["backbones"]:
        for e in PRIVATE_EPS:
            targets += [TABLE1.format(backbone=b, eps=e) + ext for ext in (".parquet", ".md", ".tex")]
            targets += [FIGURE_INTERPOLATION.format(backbone=b, eps=e) + ext for ext in (".png", ".pdf")]
    return targets


def operator_params(wildcards):
    """The merge's operator, vectors, hyperparameters and statistics file as flags (a change reruns only this
    merge onwards)."""
    name = wildcards.operator
    flags = [f"--method {merge_operator(name)}", f"--vectors {config['merge'][name].get('vectors', 'task')}",
             f"--name {name}"]
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
    flags = [f"--kind {NEEDS_STATISTICS[merge_operator(name)]}", f"--source {settings['data']}",
             f"--examples {settings.get('examples', 256)}", f"--seed {seed_number(wildcards)}"]
    if settings["data"] == "private":
        flags += [f"--clip-norm {settings['clip_norm']}", f"--epsilon {settings['epsilon']}"]
    return " ".join(flags)


def all_statistics():
    return [
        STATISTICS.format(operator=name, **g)
        for g in release_grid()
        for name in config["merge"]
        if merge_operator(name) in NEEDS_STATISTICS
    ]


def interpolation_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["interpolation"]["operator"], **wildcards)


def curvature_merged_model(wildcards):
    return MERGED.format(operator=config["diagnostics"]["curvature"]["operator"], **wildcards)


def table1_caption(wildcards):
    kind = config["backbones"][wildcards.backbone]["kind"]
    eps = eps_value(wildcards.eps)
    return (
        f"Multi-task scores (0-100, each task's own metric) with {kind} ({wildcards.backbone}), "
        f"epsilon = {eps:g}, mean over {len(SEEDS)} seed(s)."
    )


def interpolation_title(wildcards):
    operator = config["diagnostics"]["interpolation"]["operator"]
    return f"{wildcards.backbone}, epsilon = {eps_value(wildcards.eps):g}: path from task model to {operator} merge"
