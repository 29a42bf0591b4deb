"""The fine-tuning methods are stated once (dpmerge/methods.py); everything that lists them reads that table or is
held to it here: the step functions and the hyperparameters they take by name, the config check (the schema
names no method), the CLI's help, the report's labels and orders."""

import inspect
from pathlib import Path

import pytest
import yaml

from dpmerge.methods import (
    ABLATIONS,
    BASELINE,
    FIGURE_ORDER,
    METHODS,
    PROPOSED,
    Method,
)

ROOT = Path(__file__).resolve().parents[1]


def keyword_parameters(function) -> tuple[str, ...]:
    return tuple(name for name, p in inspect.signature(function).parameters.items() if p.kind is p.KEYWORD_ONLY)


def test_every_method_has_one_step_function_taking_exactly_its_hyperparameters_by_name():
    from dpmerge.training.dp_step import STEPS

    assert list(STEPS) == list(METHODS)
    for name, method in METHODS.items():
        assert keyword_parameters(STEPS[name]) == method.hyperparameters, name


def test_method_update_refuses_a_step_without_its_hyperparameters():
    from dpmerge.training.dp_step import method_update

    with pytest.raises(TypeError, match="dp_merging needs rho, anchor_lambda"):
        method_update(METHODS["dp_merging"], None, [], [], (), None)


def test_the_spec_says_what_each_term_costs():
    assert [m.queries_per_step for m in METHODS.values()] == [1, 1, 2, 1, 2, 1, 1, 1]
    assert METHODS["dp_merging"].hyperparameters == ("rho", "anchor_lambda")
    assert METHODS["naive_dp"].hyperparameters == ()
    with pytest.raises(ValueError, match="one_query is a way of doing flatness"):
        Method("x", "X", "x", True, "ablation", one_query=True)
    with pytest.raises(ValueError, match="role must be one of"):
        Method("x", "X", "x", True, "rival")


def test_the_schema_names_no_method_and_the_config_check_reads_the_spec():
    """A method added to dpmerge/methods.py is configurable with no schema edit: the schema lists no method (it
    would restate the spec), and the config check refuses a name the spec lacks, naming the field."""
    from dpmerge.config_check import ConfigError, _check_method_names

    def enums(node):
        if isinstance(node, dict):
            yield from ([node["enum"]] if "enum" in node else [])
            for value in node.values():
                yield from enums(value)
        elif isinstance(node, list):
            for value in node:
                yield from enums(value)

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert [enum for enum in enums(schema) if set(enum) & set(METHODS)] == []
    config = {"methods": [BASELINE, PROPOSED], "diagnostics": {"landscape": {"methods": [PROPOSED]}},
              "finetune": {"by_method": {"nonprivate": {}}},
              "sweeps": {"epsilon": {"methods": [BASELINE]}, "rho": {"method": PROPOSED}}}
    _check_method_names(config)
    for field, value, message in [
        (("methods",), ["dp_magic"], "methods: unknown method 'dp_magic'; known methods: nonprivate"),
        (("sweeps", "epsilon", "methods"), ["nonprivate"], "sweeps.epsilon.methods: unknown method 'nonprivate'"),
        (("sweeps", "rho", "method"), "dp_anchor", "methods that take rho: dp_sam, dp_merging, dp_sat, dp_sat_anchor"),
        (("finetune", "by_method"), {"dp_magic": {}}, "finetune.by_method: unknown method 'dp_magic'"),
    ]:
        broken = {**config, "sweeps": {k: dict(v) for k, v in config["sweeps"].items()},
                  "finetune": dict(config["finetune"])}
        target = broken
        for key in field[:-1]:
            target = target[key]
        target[field[-1]] = value
        with pytest.raises(ConfigError, match=message):
            _check_method_names(broken)


def test_the_cli_help_names_every_method():
    from dpmerge.cli_arguments import build_parser

    for command in ("finetune", "audit"):
        help_text = build_parser()._subparsers._group_actions[0].choices[command].format_help()
        assert [m for m in METHODS if m not in " ".join(help_text.split())] == [], command


def test_the_report_reads_labels_rows_and_order_from_the_spec():
    from dpmerge.report.figures import METHOD_ORDER
    from dpmerge.report.labels import ABLATION_ROWS, METHOD_LABELS

    assert METHOD_LABELS == {name: m.label for name, m in METHODS.items()}
    assert [m for m, _ in ABLATION_ROWS] == [BASELINE, "dp_sam", "dp_anchor", PROPOSED, "dp_sat", "dp_sat_anchor"]
    assert METHOD_ORDER == FIGURE_ORDER and FIGURE_ORDER[-1] == PROPOSED
    assert set(ABLATIONS) == {"dp_sam", "dp_anchor", "dp_sat", "dp_sat_anchor"}
