"""`snakemake --config` overrides mean what they say: Snakemake reads the items of a value as text (`seeds=[0]`
arrives as ['0']), and the config check reads them by the schema's types before validating
(dpmerge/config_check.py, coerce_config). Text that does not read as its field's type is refused naming the field.
"""

import copy
import subprocess
from pathlib import Path

import pytest
import yaml
from snakemake.cli import parse_config
from snakemake.utils import update_config

from dpmerge.config_check import ConfigError, check_config, coerce_config
from dpmerge.methods import METHODS
from workflow_runs import ROOT, SNAKEMAKE, snakemake_env

DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())


def overridden(*entries: str) -> dict:
    """config.yaml with `--config` entries applied the way Snakemake applies them."""
    config = copy.deepcopy(DEFAULT)
    update_config(config, parse_config(list(entries)))
    return config


def test_snakemake_hands_list_items_over_as_text():
    # the reason for the coercion; should Snakemake ever type them itself, the coercion is a no-op
    assert parse_config(["seeds=[0]", "epsilons=[1,4]"]) == {"seeds": ["0"], "epsilons": ["1", "4"]}


def test_lists_of_integers_numbers_and_words_are_read_by_their_items_types():
    config = overridden("seeds=[0,3]", "epsilons=[1,0.5,1e-3]", "methods=[naive_dp,dp_merging]")
    coerce_config(config)
    assert config["seeds"] == [0, 3] and all(type(s) is int for s in config["seeds"])
    assert config["epsilons"] == [1, 0.5, 0.001] and type(config["epsilons"][0]) is int
    assert config["methods"] == ["naive_dp", "dp_merging"]


def test_one_value_where_a_list_is_asked_for_becomes_a_list():
    config = overridden("epsilons=4", "seeds=2", "methods=naive_dp")
    coerce_config(config)
    assert (config["epsilons"], config["seeds"], config["methods"]) == ([4], [2], ["naive_dp"])


def test_nested_objects_are_read_field_by_field():
    config = overridden(
        "finetune={lr: 1e-3, betas: [0.8, 0.99], delta: null, by_method: {nonprivate: {lr: 3e-4}}}",
        "backbones={effnet: {trainable_blocks: 2, resources: {mem_mb: 2000, runtime: 720},"
        " finetune: {epochs: 3, by_method: {dp_sam: {rho: 0.1}}}}, minilm: {trainable_blocks: all,"
        " resources: {runtime: 12h}}}",
        "data={max_train: null, max_test: 50}", "evaluation={cross_task: true}",
        "diagnostics={curvature: {gammas: [0, 0.5]}}")
    coerce_config(config)
    finetune, effnet, minilm = config["finetune"], config["backbones"]["effnet"], config["backbones"]["minilm"]
    assert finetune["lr"] == 0.001 and finetune["betas"] == [0.8, 0.99] and finetune["delta"] is None
    assert finetune["by_method"] == {"nonprivate": {"lr": 0.0003}}
    assert effnet["trainable_blocks"] == 2 and effnet["resources"] == {"mem_mb": 2000, "runtime": 720}
    assert effnet["finetune"]["epochs"] == 3 and effnet["finetune"]["by_method"]["dp_sam"]["rho"] == 0.1
    # a text field stays text where it is not a number; the alternative "all" stays a word
    assert minilm["trainable_blocks"] == "all" and minilm["resources"]["runtime"] == "12h"
    assert effnet["tasks"] == DEFAULT["backbones"]["effnet"]["tasks"]  # merged in, untouched
    assert config["data"]["max_train"] is None and config["data"]["max_test"] == 50
    assert config["evaluation"]["cross_task"] is True
    assert config["diagnostics"]["curvature"]["gammas"] == [0, 0.5]


def test_merge_hyperparameters_take_their_defaults_types():
    config = overridden("merge={ties: {density: 0.5}, wudi: {iterations: 3, include_conv: false}}")
    coerce_config(config)
    assert config["merge"]["ties"]["density"] == 0.5
    assert config["merge"]["ties"]["merge_func"] == "mean"  # from config.yaml, still a word
    assert config["merge"]["wudi"] == {"iterations": 3, "include_conv": False}


def test_a_number_where_text_is_asked_for_becomes_text():
    config = overridden("results=2024")
    assert config["results"] == 2024  # Snakemake's reading
    coerce_config(config)
    assert config["results"] == "2024"


@pytest.mark.parametrize("path", [ROOT / "config.yaml", *sorted((ROOT / "presets").glob("*.yaml"))],
                         ids=lambda p: p.name)
def test_configs_typed_by_their_files_pass_unchanged(path):
    config = yaml.safe_load(path.read_text())
    before = copy.deepcopy(config)
    coerce_config(config)
    assert config == before
    assert [type(v) for v in config["epsilons"]] == [type(v) for v in before["epsilons"]]


@pytest.mark.parametrize("entry,message", [
    ("seeds=[0,a]", "seeds.1: 'a' is not of type 'integer': expected a whole number"),
    ("seeds=[0.5]", "seeds.0: '0.5' is not of type 'integer'"),
    ("epsilons=[1,four]", "epsilons.1: 'four' is not of type 'number': expected a number"),
    ("epsilons=[inf]", "epsilons.0: 'inf' is not of type 'number'"),
    ("finetune={lr: fast}", "finetune.lr: 'fast' is not of type 'number'"),
    ("finetune=fast", "finetune: 'fast' is not of type 'object': expected a mapping"),
    ("finetune={by_method: {nonprivate: {lr: big}}}", "finetune.by_method.nonprivate.lr: 'big' is not of type"),
    ("data={max_train: many}", "data.max_train: 'many' is not of type 'integer' or 'null': expected a whole "
                               "number or null"),
    ("evaluation={cross_task: maybe}", "evaluation.cross_task: 'maybe' is not of type 'boolean': expected true "
                                       "or false"),
    ("backbones={effnet: {trainable_blocks: two}}",
     "backbones.effnet.trainable_blocks: 'two' is not valid here: expected a whole number (at least 1) or 'all'"),
    ("backbones={minilm: {finetune: {by_method: {dp_sam: {rho: wide}}}}}",
     "backbones.minilm.finetune.by_method.dp_sam.rho: 'wide' is not of type 'number'"),
])
def test_text_that_does_not_read_as_its_type_is_refused_naming_the_field(entry, message):
    with pytest.raises(ConfigError) as refused:
        check_config(overridden(entry))
    assert message in str(refused.value) and len(str(refused.value).splitlines()) == 1


def test_a_merge_hyperparameter_that_does_not_read_is_named_with_its_default():
    with pytest.raises(ConfigError, match=r"merge\.ties: .*'density' must be a number \(default 0\.2\), got 'lots'"):
        check_config(overridden("merge={ties: {density: lots}}"))


@pytest.mark.slow
def test_overridden_config_passes_the_whole_check():
    config = overridden("seeds=[0]", "epsilons=[1,4]", "methods=[naive_dp,dp_merging]", "finetune={lr: 1e-3}")
    check_config(config)
    assert config["seeds"] == [0] and config["epsilons"] == [1, 4] and config["finetune"]["lr"] == 0.001


def dry_run(workdir: Path, *config_entries: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--configfile", str(ROOT / "config.yaml"),
                           "--cores", "1", "-n", "--printshellcmds", "--config", *config_entries],
                          capture_output=True, text=True, env=snakemake_env())


def test_dry_run_plans_the_overridden_grid(tmp_path):
    entries = ("seeds=[0]", "epsilons=[1,4]", "methods=[naive_dp,dp_merging]", "finetune={clip_norm: 0.5}")
    # the overrides differ from config.yaml's values, so the plan below can only come from them
    assert (DEFAULT["seeds"], DEFAULT["epsilons"]) != ([0], [1, 4]) and DEFAULT["finetune"]["clip_norm"] != 0.5
    result = dry_run(tmp_path, *entries)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    commands = [line for line in result.stdout.splitlines() if "dpmerge finetune " in line]
    tasks = sum(len(backbone["tasks"]) for backbone in DEFAULT["backbones"].values())
    assert all(METHODS[m].private for m in ("naive_dp", "dp_merging"))
    assert len(commands) == tasks * 2 * 2  # tasks x methods x epsilons x one seed
    assert {c.split("--epsilon ")[1].split()[0] for c in commands} == {"1.0", "4.0"}
    assert {c.split("--seed ")[1].split()[0] for c in commands} == {"0"}
    assert {c.split("--method ")[1].split()[0] for c in commands} == {"naive_dp", "dp_merging"}
    # the nested override reached every fine-tune (no backbone sets a clip norm of its own; both set their lr)
    assert not any("clip_norm" in (b.get("finetune") or {}) for b in DEFAULT["backbones"].values())
    assert all('"clip_norm": 0.5,' in c for c in commands)
    assert "results/taskvectors/effnet/eps1/naive_dp/s0/digits.safetensors" in result.stdout
    assert not (tmp_path / "results").exists()


def test_dry_run_refuses_text_of_the_wrong_type_in_a_few_lines(tmp_path):
    result = dry_run(tmp_path, "seeds=[0,a]")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "seeds.1: 'a' is not of type 'integer': expected a whole number" in output
    assert "Traceback" not in output and len(output.splitlines()) < 15
    assert not (tmp_path / "results").exists()


def test_a_backbones_own_seeds_replace_the_studys_on_that_backbone_only(tmp_path):
    result = dry_run(tmp_path, "seeds=[0]", "methods=[naive_dp]", "backbones={minilm: {seeds: [3, 5]}}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    commands = [line for line in result.stdout.splitlines() if "dpmerge finetune " in line]
    seeds = {}
    for command in commands:
        backbone = command.split("--backbone ")[1].split()[0]
        seeds.setdefault(backbone, set()).add(command.split("--seed ")[1].split()[0])
    effnet_default = DEFAULT["backbones"]["effnet"].get("seeds")
    assert seeds["minilm"] == {"3", "5"}
    assert seeds["effnet"] == ({str(s) for s in effnet_default} if effnet_default else {"0"})
    assert "results/scores/merged/minilm/eps4/naive_dp/s5/ties.parquet" in result.stdout
    assert "results/scores/merged/minilm/eps4/naive_dp/s0/" not in result.stdout


def test_the_budget_protocol_refuses_a_backbones_own_seeds():
    protocol = yaml.safe_load((ROOT / "presets/protocol.yaml").read_text())
    next(iter(protocol["backbones"].values()))["seeds"] = [0, 1]
    with pytest.raises(ConfigError, match=r"backbones\.[\w-]+\.seeds: the budget protocol compares its candidates"):
        check_config(protocol)
