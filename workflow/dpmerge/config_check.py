"""Every check of an experiment config, made before any job runs (workflow/rules/settings.smk calls `check_config`).

A bad config stops the workflow with one message that names the field and what was expected. The checks live
here, not in the Snakefile, so the tests can try each bad config in-process instead of starting Snakemake.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path

import jsonschema
import yaml

# Only torch-free registries: the Snakefile runs these checks before any job (tests/test_structure.py).
from dpmerge.config_fields import (  # noqa: F401 - re-exported: callers import the checks' names from here
    MERGE_META_KEYS,
    ConfigError,
    check_data_free_merge,
    finetune_settings,
    merge_hyperparameters,
    merge_operator,
    released_budgets,
)
from dpmerge.config_sampling import check_sampling
from dpmerge.config_studies import check_studies
from dpmerge.data.own import OwnTaskError, check_data, check_entry, modality_of
from dpmerge.data.registry import TASKS, records_overlap
from dpmerge.epsilon import eps_label
from dpmerge.merge.checks import check_hyperparameters
from dpmerge.merge.specs import NEEDS_STATISTICS
from dpmerge.merge.specs import SPECS as OPERATORS
from dpmerge.methods import METHODS, PRIVATE_MERGED_METHODS, SWEPT_PARAMETERS
from dpmerge.models.registry import BACKBONES

SCHEMA = Path(__file__).resolve().parents[1] / "schemas/config.schema.yaml"

def check_config(config: dict, read_own_data: bool = True) -> None:
    """Validate against the schema (filling in its defaults, in place), then the checks a schema cannot express.
    Raises ConfigError naming the field (a schema violation too: `schema_error` keeps it to one line).
    `read_own_data`: read every own task's data whole (the workflow's main process; its jobs, which parse the
    config again, skip it)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if "public_examples" in (config.get("data") or {}):
        raise ConfigError(
            "data.public_examples is gone: examples held out of a private training split are private (people of "
            "the same private population), never public data. Give RegMean / Fisher statistics {data: private, "
            "clip_norm: C, epsilon: E} (privatized and composed), or declare a public dataset outside every "
            "private training set with backbones.<name>.public_data and use {data: public}")
    coerce_config(config)
    try:
        validate(config, schema=str(SCHEMA))
    except WorkflowError as error:
        raise ConfigError(schema_error(config, error)) from None
    _check_results_folder(config)
    _check_own_tasks(config)
    _check_backbones(config)
    own_sizes = _check_own_task_data(config, read_own_data)
    _check_shared_records(config)
    _check_method_names(config)
    _check_privacy(config)
    _check_merges(config)
    _check_finetune_overrides(config)
    check_sampling(config, own_sizes)
    if not config["merge"]:
        # The training-budget protocol scores individual models on a validation split and must not merge: its
        # choice is made before any merged result exists.
        if not config["data"].get("validation_fraction"):
            raise ConfigError("merge: configure at least one merge; an empty merge section is for the budget "
                              "protocol (data.validation_fraction, presets/protocol.yaml)")
        if config["sweeps"]:
            raise ConfigError("sweeps: the budget protocol (no merges) runs no sweeps")
        own_seeds = [name for name, backbone in config["backbones"].items() if "seeds" in backbone]
        if own_seeds:
            raise ConfigError(f"backbones.{own_seeds[0]}.seeds: the budget protocol compares its candidates at the "
                              "same seeds; set the study's seeds only")
        return
    _check_diagnostics(config)
    _check_tables_and_sweeps(config)
    _check_audit(config)
    check_studies(config)


def schema_error(config: dict, error: Exception) -> str:
    """One line for a schema violation: the field's dotted path, what jsonschema says is wrong and, for an
    unknown key, the closest known one ("did you mean") and the keys allowed there. Snakemake's own message
    prints the whole schema (over a thousand lines for a one-letter typo)."""
    schema = yaml.safe_load(SCHEMA.read_text())
    found = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(config))
    if found is None:  # snakemake saw something jsonschema alone does not: keep its first lines
        return "config: " + " ".join(str(error).splitlines()[:3])
    path = ".".join(str(part) for part in found.absolute_path) or "config"
    message = f"{path}: {found.message}"
    if found.validator == "additionalProperties" and isinstance(found.instance, dict):
        allowed = sorted(found.schema.get("properties", {}))
        for key in sorted(set(found.instance) - set(allowed)):
            close = difflib.get_close_matches(str(key), allowed, n=1)
            if close:
                message += f"; did you mean {close[0]!r} instead of {key!r}?"
        message += f" (allowed here: {', '.join(allowed)})"
    if found.validator == "uniqueItems":
        message += "; list each value once (a seed counted twice would count one run twice in every interval)"
    return message + _what_to_give(found)


def _what_to_give(error) -> str:
    """The fix for a value of the wrong type or out of range: what the field takes."""
    if error.validator in ("type", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minItems",
                           "maxItems"):
        return f"; give {_describe(error.schema)}"
    return ""


# What each JSON-schema type is called in a message. The readers take YAML's spellings, plus the exponent
# without a dot (1e-3) that PyYAML reads as text but a user means as a number.
TYPE_WORDS = {"null": "null", "boolean": "true or false", "integer": "a whole number", "number": "a number",
              "string": "text", "array": "a list", "object": "a mapping"}
_NOT_READ = object()
_INTEGER = re.compile(r"[-+]?[0-9]+")
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def _read_number(text: str):
    if _INTEGER.fullmatch(text):
        return int(text)  # as a config file's 4 reads
    return float(text) if _NUMBER.fullmatch(text) and math.isfinite(float(text)) else _NOT_READ


_READERS = {
    "null": lambda text: None if text in ("", "~", "null", "Null", "NULL") else _NOT_READ,
    "boolean": lambda text: {"true": True, "yes": True, "on": True, "false": False, "no": False,
                             "off": False}.get(text.lower(), _NOT_READ),
    "integer": lambda text: int(text) if _INTEGER.fullmatch(text) else _NOT_READ,
    "number": _read_number,
}


def coerce_config(config: dict) -> None:
    """Give each value the type the schema asks for where it arrived as text, in place, before validation.

    `snakemake --config` reads the items of a value with YAML's base loader, which keeps every scalar as text:
    `seeds=[0]` arrives as ['0'], `finetune={lr: 1e-3}` as {'lr': '1e-3'}; and `epsilons=4` is one number where
    a list is asked for. Values a config file typed already pass unchanged. A text the schema's type cannot read
    raises ConfigError naming the field and the expected type. Merge hyperparameters take their default's type
    (merge/specs.py); one that does not read as it is left for check_hyperparameters, which names the default."""
    try:
        coerced = _coerce(config, _coercion_schema(), "")
    except ConfigError as error:
        raise error.with_traceback(None) from None  # Snakemake prints the frames: not the recursion's
    merges = coerced.get("merge")
    for name, entry in merges.items() if isinstance(merges, dict) else ():
        operator = entry.get("operator", name) if isinstance(entry, dict) else None
        if isinstance(operator, str) and operator in OPERATORS:
            _coerce_hyperparameters(entry, OPERATORS[operator].defaults)
    config.update(coerced)


def _coerce_hyperparameters(entry: dict, defaults: dict) -> None:
    for key, default in defaults.items():
        kind = "boolean" if isinstance(default, bool) else "number" if isinstance(default, (int, float)) else None
        read = _READERS[kind](entry[key].strip()) if kind and isinstance(entry.get(key), str) else _NOT_READ
        if read is not _NOT_READ:
            entry[key] = read


def _coercion_schema() -> dict:
    """The config schema with the finetune settings' types where it only says `object` (by_method entries and
    the backbones' finetune, which _check_finetune_overrides validates): used to read values, never to validate."""
    schema = yaml.safe_load(SCHEMA.read_text())
    settings = _finetune_settings_schema()
    schema["properties"]["finetune"]["properties"]["by_method"]["additionalProperties"] = settings
    schema["properties"]["backbones"]["additionalProperties"]["properties"]["finetune"] = {
        "type": "object",
        "properties": {**settings["properties"], "by_method": {"type": "object", "additionalProperties": settings},
                       "by_task": _by_task_schema(settings)}}
    return schema


def _coerce(value, schema: dict, path: str):
    alternatives = schema.get("oneOf") or schema.get("anyOf")
    if alternatives:
        return _coerce_alternatives(value, alternatives, path)
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if types == ["array"] and value is not None and not isinstance(value, (list, dict)):
        value = [value]  # one value where a list is asked for: `--config epsilons=4`
    where = f"{path}." if path else ""
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_coerce(item, schema["items"], f"{where}{i}") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {key: _coerce(item, sub, f"{where}{key}") if (sub := _property_schema(schema, key)) else item
                for key, item in value.items()}
    if isinstance(value, str) and types:
        return _read_text(value, types, path)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and types == ["string"]:
        return str(value)  # `--config results=2024`: Snakemake made a number of a folder name
    return value


def _property_schema(schema: dict, key: str) -> dict | None:
    found = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
    return found if isinstance(found, dict) else None


def _read_text(text: str, types: list[str], path: str):
    for kind in ("null", "boolean", "integer", "number"):
        if kind in types and (read := _READERS[kind](text.strip())) is not _NOT_READ:
            return read
    if "string" in types:
        return text
    raise ConfigError(f"{path or 'config'}: {text!r} is not of type {' or '.join(repr(t) for t in types)}: "
                      f"expected {' or '.join(TYPE_WORDS.get(t, t) for t in types)}")


def _coerce_alternatives(value, alternatives: list[dict], path: str):
    """The first alternative's reading that the alternative accepts (`trainable_blocks`: 2 or all); where none
    does, ConfigError saying what each would take (jsonschema says only "not valid under any")."""
    for alternative in alternatives:
        try:
            reading = _coerce(value, alternative, path)
        except ConfigError:
            continue
        if jsonschema.validators.validator_for(alternative)(alternative).is_valid(reading):
            return reading
    raise ConfigError(f"{path or 'config'}: {value!r} is not valid here: expected "
                      f"{' or '.join(_describe(alternative) for alternative in alternatives)}")


def _describe(schema: dict) -> str:
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(repr, schema["enum"]))
    types = schema.get("type", [])
    words = " or ".join(TYPE_WORDS.get(t, t) for t in ([types] if isinstance(types, str) else types)) or "a value"
    bounds = [f"{word} {schema[key]}" for key, word in (("minimum", "at least"), ("exclusiveMinimum", "above"),
                                                         ("maximum", "at most"), ("exclusiveMaximum", "below"))
              if key in schema]
    bounds += [f"{word} {schema[key]} item(s)" for key, word in (("minItems", "at least"), ("maxItems", "at most"))
               if key in schema]
    return f"{words} ({', '.join(bounds)})" if bounds else words


def _check_own_tasks(config):
    """Each own task's declaration (data/own.py check_entry: fields, source, metric), without reading its data;
    a name the registry already has would be ambiguous."""
    for name, entry in (config.get("own_tasks") or {}).items():
        if name in TASKS:
            raise ConfigError(f"own_tasks.{name}: {name!r} is a task dpmerge already has; give yours another name")
        try:
            check_entry(name, entry)
        except OwnTaskError as error:
            raise ConfigError(str(error)) from None


def _check_own_task_data(config, read_data: bool) -> dict:
    """Each own task a backbone trains on: what its data must hold, read before any job (data/own.py check_data),
    then, where `read_data`, the whole task as `prepare` will read it. Returns each one's N where read."""
    own, sizes = config.get("own_tasks") or {}, {}
    for name in dict.fromkeys(task for backbone in config["backbones"].values() for task in backbone["tasks"]):
        if name in own:
            try:
                check_data(name, own[name])
                if read_data:
                    from dpmerge.data.own_readers import training_examples  # numpy and PIL: only for own tasks

                    sizes[name] = training_examples(name, own[name])
            except OwnTaskError as error:
                raise ConfigError(str(error)) from None
    return sizes


def _check_results_folder(config):
    """The results folder must be a folder (it is created where missing). One outside the working directory is
    allowed (scratch space on a cluster) and said once, so that a typo does not scatter results unnoticed."""
    import sys

    results = Path(str(config["results"]))
    if results.exists() and not results.is_dir():
        raise ConfigError(f"results: {results} is a file, not a folder; give a folder for the study's results (it is "
                          "created if missing), e.g. results: results")
    if results.resolve() != Path.cwd() and Path.cwd() not in results.resolve().parents:
        print(f"dpmerge: results folder {results.resolve()} lies outside the working directory", file=sys.stderr)


def _check_backbones(config):
    for name, backbone in config["backbones"].items():
        modality = BACKBONES[backbone["kind"]].modality
        unused = [key for key in ("model", "pretrained", "cache_dir")
                  if key in backbone and key not in BACKBONES[backbone["kind"]].options]
        if unused:
            raise ConfigError(f"backbones.{name}.{unused[0]}: not an option of kind {backbone['kind']!r} (its "
                              f"options: {', '.join(BACKBONES[backbone['kind']].options)})")
        if backbone["kind"] == "open_clip" and "model" not in backbone:
            raise ConfigError(f"backbones.{name}.model: kind open_clip needs an open_clip model name or config JSON")
        own = config.get("own_tasks") or {}
        for task in backbone["tasks"]:
            if task in own:
                if modality_of(own[task]) != modality:
                    raise ConfigError(f"backbones.{name}.tasks: own task {task!r} is a {modality_of(own[task])} "
                                      f"task, but {backbone['kind']!r} is a {modality} backbone")
                continue
            if task not in TASKS:
                raise ConfigError(f"backbones.{name}.tasks: unknown task {task!r}; known tasks: "
                                  f"{', '.join(sorted(TASKS))}, or declare it under own_tasks")
            if TASKS[task].needs_data_dir and not config["data"].get("dir"):
                raise ConfigError(f"backbones.{name}.tasks: {task!r} is read from a data directory; set data.dir "
                                  "(`dpmerge prepare-data --help` writes the expected layout)")
            if TASKS[task].modality != modality:
                raise ConfigError(f"backbones.{name}.tasks: {task!r} is a {TASKS[task].modality} task, "
                                  f"but {backbone['kind']!r} is a {modality} backbone")
        public = backbone.get("public_data")
        if public is not None:
            private = {task: other for other, entry in config["backbones"].items() for task in entry["tasks"]}
            if public in own:
                if modality_of(own[public]) != modality:
                    raise ConfigError(f"backbones.{name}.public_data: own task {public!r} is not a {modality} "
                                      "dataset")
            elif public not in TASKS:
                raise ConfigError(f"backbones.{name}.public_data: unknown dataset {public!r}; known: "
                                  f"{', '.join(sorted(TASKS))}")
            if public in private:
                raise ConfigError(f"backbones.{name}.public_data: {public!r} is a private task (of backbone "
                                  f"{private[public]!r}); public data must lie outside every private training set")
            shared = [task for task in private if records_overlap(public, task)]
            if shared:
                raise ConfigError(f"backbones.{name}.public_data: {public!r} is built from the records of the private "
                                  f"task {shared[0]!r}; public data must lie outside every private training set")
            if public not in own and TASKS[public].modality != modality:
                raise ConfigError(f"backbones.{name}.public_data: {public!r} is a {TASKS[public].modality} "
                                  f"dataset, but {backbone['kind']!r} is a {modality} backbone")


def _check_shared_records(config):
    """Two tasks built from the same private records (registry: shares_records_with) would spend one record's
    budget twice under two tasks' separate accounts: a study trains on one of them."""
    trained = [(name, task) for name, entry in config["backbones"].items() for task in entry["tasks"]]
    for i, (first_backbone, first) in enumerate(trained):
        for backbone, task in trained[i + 1:]:
            if records_overlap(first, task):
                raise ConfigError(f"backbones.{backbone}.tasks: {task!r} is built from the same records as {first!r} "
                                  f"(backbone {first_backbone!r}); a study may train on one of the two, since each "
                                  "private record's budget is accounted under one task")


# privacy/accounting.py's REPLACE_ONE_ACCOUNTANTS, restated: this module is read while Snakemake parses the rules,
# where numpy may be absent (tests/test_neighbouring.py holds the two equal).
REPLACE_ONE_ACCOUNTANTS = ("pld",)


def _check_privacy(config):
    """The relation and the accountant agree; add/remove has a public size for every private task."""
    privacy = config["privacy"]
    public_n = privacy.get("public_n")
    private = [m for m in config["methods"] if m != "nonprivate"]
    if privacy["neighbouring"] == "replace_one":
        if public_n is not None:
            raise ConfigError("privacy.public_n is for add_remove only: under replace_one N is public and sets q")
        for backbone in config["backbones"]:
            for method in private:
                accountant = finetune_settings(config, backbone, method).get("accountant", "pld")
                if accountant not in REPLACE_ONE_ACCOUNTANTS:
                    raise ConfigError(f"finetune.accountant {accountant!r} (backbone {backbone}, method {method}) "
                                      f"accounts add/remove only; replace_one needs "
                                      f"{' or '.join(REPLACE_ONE_ACCOUNTANTS)}")
        return
    if not private:
        return
    if public_n is None:
        raise ConfigError("privacy.neighbouring add_remove needs privacy.public_n: a public dataset size (one "
                          "number, or {task: size}) for q, the steps and delta, since N itself differs between "
                          "add/remove neighbours; or use replace_one (the default), which treats N as public")
    if isinstance(public_n, dict):
        tasks = sorted({t for entry in config["backbones"].values() for t in entry["tasks"]})
        missing = [t for t in tasks if t not in public_n]
        if missing:
            raise ConfigError(f"privacy.public_n names no size for task(s) {', '.join(missing)}")


def _check_method_names(config):
    """Every method named is one of dpmerge/methods.py's, of the kind its field takes. The schema lists none, so
    a method added there needs no edit anywhere else to be configured."""
    def known(field: str, names, allowed, what: str) -> None:
        for name in names:
            if name not in allowed:
                raise ConfigError(f"{field}: unknown method {name!r}; {what}: {', '.join(allowed)}")

    known("methods", config["methods"], METHODS, "known methods")
    known("diagnostics.landscape.methods", config["diagnostics"]["landscape"]["methods"], METHODS, "known methods")
    known("finetune.by_method", (config.get("finetune") or {}).get("by_method") or {}, METHODS, "known methods")
    sweeps = config.get("sweeps") or {}
    if "epsilon" in sweeps:
        known("sweeps.epsilon.methods", sweeps["epsilon"]["methods"], PRIVATE_MERGED_METHODS,
              "private methods that release a task vector")
    for parameter in ("rho", "anchor_lambda"):
        if parameter in sweeps:
            known(f"sweeps.{parameter}.method", [sweeps[parameter]["method"]],
                  [m for m, spec in METHODS.items() if parameter in spec.hyperparameters],
                  f"methods that take {parameter}")


def _check_merges(config):
    for name in config["merge"]:
        operator = merge_operator(config, name)
        if operator not in OPERATORS:
            raise ConfigError(f"merge.{name}: no operator named {operator!r}; give `operator:` one of "
                              f"{', '.join(OPERATORS)}")
        statistics = config["merge"][name].get("statistics")
        if operator in NEEDS_STATISTICS:
            if statistics is None:
                raise ConfigError(
                    f"merge.{name}: {operator} needs data statistics; add statistics: "
                    "{data: private, clip_norm: C, epsilon: E} (privatized, composed with each task's budget) or "
                    "{data: public} (a dataset each backbone declares public: backbones.<name>.public_data)")
            lacking = [b for b, entry in config["backbones"].items() if "public_data" not in entry]
            if statistics["data"] == "public" and lacking:
                raise ConfigError(f"merge.{name}.statistics.data: public needs a dataset declared public for every "
                                  f"backbone; backbones.{lacking[0]}.public_data is not set")
            if statistics["data"] == "private" and not {"clip_norm", "epsilon"} <= set(statistics):
                raise ConfigError(f"merge.{name}.statistics: data: private needs clip_norm and epsilon")
        elif statistics is not None:
            raise ConfigError(f"merge.{name}.statistics: {operator} uses no data statistics")
        defaults = OPERATORS[operator].defaults
        unknown = set(merge_hyperparameters(config, name)) - set(defaults)
        if unknown:
            raise ConfigError(f"merge.{name}: unknown hyperparameter(s) {sorted(unknown)} for operator "
                              f"{operator!r}; allowed: {', '.join(defaults) or 'none'}")
        try:  # the ranges every merge checks, now: a bad value stops the dry run, not the merge after training
            check_hyperparameters(operator, merge_hyperparameters(config, name))
        except ValueError as error:
            raise ConfigError(f"merge.{name}: {error}") from None
        if OPERATORS[operator].task_vectors_only and config["merge"][name].get("vectors") == "difference":
            raise ConfigError(f"merge.{name}.vectors: {operator} is defined on task vectors only")


def _finetune_settings_schema():
    """The schema of one level of finetune settings: the global finetune properties without by_method."""
    properties = dict(yaml.safe_load(SCHEMA.read_text())["properties"]["finetune"]["properties"])
    properties.pop("by_method")
    return {"type": "object", "additionalProperties": False, "properties": properties}


def _by_task_schema(settings: dict) -> dict:
    """A backbone's finetune.by_task: each task's own batch size, and nothing else (settings: one level of finetune
    settings, `_finetune_settings_schema`)."""
    return {"type": "object", "additionalProperties": {
        "type": "object", "additionalProperties": False, "required": ["batch_size"],
        "properties": {"batch_size": settings["properties"]["batch_size"]}}}


def _check_overrides(where, overrides, schema):
    try:
        jsonschema.validate(overrides, schema)
    except jsonschema.ValidationError as error:
        field = ".".join(str(p) for p in error.absolute_path)
        raise ConfigError(f"{where}{'.' + field if field else ''}: {error.message}{_what_to_give(error)}") from None


def _check_finetune_overrides(config):
    schema = _finetune_settings_schema()
    for method, overrides in config["finetune"]["by_method"].items():
        _check_overrides(f"finetune.by_method.{method}", overrides, schema)
    for name, backbone in config["backbones"].items():
        entry = dict(backbone.get("finetune", {}))
        by_method = entry.pop("by_method", {})
        by_task = entry.pop("by_task", {})
        _check_overrides(f"backbones.{name}.finetune", entry, schema)
        _check_overrides(f"backbones.{name}.finetune.by_task", by_task, _by_task_schema(schema))
        for task in by_task:
            if task not in backbone["tasks"]:
                raise ConfigError(f"backbones.{name}.finetune.by_task.{task}: {task!r} is not one of the backbone's "
                                  f"tasks ({', '.join(backbone['tasks'])}); a task's own batch size goes under the "
                                  "backbone that trains it")
        for method, overrides in by_method.items():
            if method not in METHODS:
                raise ConfigError(f"backbones.{name}.finetune.by_method: unknown method {method!r}; known: "
                                  f"{', '.join(METHODS)}")
            _check_overrides(f"backbones.{name}.finetune.by_method.{method}", overrides, schema)


def _check_diagnostics(config):
    for diagnostic in ("interpolation", "curvature", "landscape"):
        target = config["diagnostics"][diagnostic]["operator"]
        if target not in config["merge"]:
            raise ConfigError(f"diagnostics.{diagnostic}.operator: {target!r} is not among the configured merge "
                              f"operators ({', '.join(config['merge'])})")
        if "denoise" in config["merge"][target]:
            raise ConfigError(f"diagnostics.{diagnostic}.operator: {target!r} merges denoised releases, but the "
                              "diagnostics measure the merged model against the released task models; name an "
                              "entry without denoise")
        if OPERATORS[merge_operator(config, target)].personalized:
            raise ConfigError(f"diagnostics.{diagnostic}.operator: {target!r} gives one model per task, not one "
                              "merged model")
    if config["diagnostics"]["curvature"]["gammas"][0] != 0:
        raise ConfigError("diagnostics.curvature.gammas: the first point must be 0 (the task model itself)")


def _check_tables_and_sweeps(config):
    merges = ", ".join(config["merge"])
    if config["tables"]["operator"] not in config["merge"]:
        raise ConfigError(f"tables.operator: {config['tables']['operator']!r} is not among the configured merges "
                          f"({merges})")
    private_eps = [eps_label(e) for e in config["epsilons"]]
    for parameter, sweep in config["sweeps"].items():
        for name in sweep.get("operators", []):
            if name not in config["merge"]:
                raise ConfigError(f"sweeps.{parameter}.operators: {name!r} is not among the configured merges "
                                  f"({merges})")
        for backbone in sweep.get("backbones", []):
            if backbone not in config["backbones"]:
                raise ConfigError(f"sweeps.{parameter}.backbones: unknown backbone {backbone!r}; configured: "
                                  f"{', '.join(config['backbones'])}")
        if parameter in SWEPT_PARAMETERS and "epsilon" in sweep and eps_label(sweep["epsilon"]) not in private_eps:
            raise ConfigError(f"sweeps.{parameter}.epsilon: {sweep['epsilon']} is not one of epsilons "
                              f"{config['epsilons']} (the table compares against the main grid's run at that budget)")


def _check_audit(config):
    audit = config["audit"]
    for method in audit["methods"]:
        if method not in config["methods"]:
            raise ConfigError(f"audit.methods: {method!r} is not among the configured methods "
                              f"({', '.join(config['methods'])})")
        if METHODS[method].head_only:
            raise ConfigError(f"audit.methods: {method!r} trains a head on w0 and releases no task vector; the "
                              "audits' canaries live in the task vector")
    released = list(config["epsilons"]) + list((config.get("sweeps") or {}).get("epsilon", {}).get("epsilons", []))
    for epsilon in audit["epsilons"]:
        if eps_label(epsilon) not in [eps_label(e) for e in released]:
            raise ConfigError(f"audit.epsilons: {epsilon} is not a released budget (epsilons {config['epsilons']} "
                              "or sweeps.epsilon.epsilons)")
    for backbone in audit["backbones"]:
        if backbone not in config["backbones"]:
            raise ConfigError(f"audit.backbones: unknown backbone {backbone!r}; configured: "
                              f"{', '.join(config['backbones'])}")
    # a release group's pooled audit holds every task's and audited seed's canaries
    runs = max([len(config["backbones"][b]["tasks"]) for b in audit["backbones"] or config["backbones"]], default=1)
    runs *= min(audit["seeds"], len(config["seeds"]))
    for kind, count in audit["canaries"].items() if audit["methods"] else ():
        if 2 * count * runs * audit["delta"] > 0.1:
            raise ConfigError(f"audit.delta: {audit['delta']} with {count} {kind} canaries in each of the {runs} runs "
                              f"of a pooled audit leaves the bound no power (2 x canaries x delta = "
                              f"{2 * count * runs * audit['delta']:.3g} > 0.1); use a delta of at most "
                              f"{0.05 / (count * runs):.2g}")
    for task, groups in audit["groups"].items():
        tasks = {t for b in config["backbones"].values() for t in b["tasks"]}
        if task not in tasks:
            raise ConfigError(f"audit.groups: {task!r} is not a configured task ({', '.join(sorted(tasks))})")
        if "black_box" not in audit["kinds"]:
            raise ConfigError("audit.groups: groups are classes of black-box canaries; add black_box to audit.kinds")
        for name in groups:
            if name in ("all", "rest"):
                raise ConfigError(f"audit.groups.{task}: {name!r} is a reserved group name")
    for name in audit["merge"]:
        check_data_free_merge(config, name, "audit.merge", "an audit merges the kept runs' task vectors into one "
                                                           "model")


