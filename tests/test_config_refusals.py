"""A bad configuration is refused before any job: one line naming the field and what was expected, by the
check itself and by the workflow that runs it."""

import pytest
import yaml
from snakemake.exceptions import WorkflowError

from dpmerge.config_check import ConfigError, check_config
from workflow_runs import TINY


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,message",
    [
        (lambda c: c.update(epsilons=[-1]), "epsilons"),
        (lambda c: c["backbones"]["effnet"].update(tasks=["digits", "cifar"]),
         "unknown task 'cifar'; known tasks: bbc_next_sentence"),
        (lambda c: c["merge"].update(fishr={}), "merge.fishr: no operator named 'fishr'; give `operator:` one of"),
        (lambda c: c["merge"].update(ties={"densty": 0.2}),
         "merge.ties: unknown hyperparameter(s) ['densty'] for operator 'ties'; allowed: density"),
        (lambda c: c["merge"].update(ties_dv={"operator": "ties", "vectors": "deltas"}), "deltas"),
        (lambda c: c["merge"].update(Bad={}), "Bad"),
        (lambda c: c["merge"].update(regmean={}), "merge.regmean: regmean needs data statistics; add statistics:"),
        (lambda c: c["data"].update(public_examples=16),
         "data.public_examples is gone: examples held out of a private training split are private"),
        (lambda c: c["backbones"]["effnet"].update(public_data="textures"),
         "backbones.effnet.public_data: 'textures' is a private task (of backbone 'effnet')"),
        (lambda c: c["backbones"]["minilm"].update(public_data="lfw"),
         "backbones.minilm.public_data: 'lfw' is a vision dataset, but 'minilm_l6' is a text backbone"),
        (lambda c: c["backbones"]["minilm"].pop("public_data"),
         "merge.regmean.statistics.data: public needs a dataset declared public for every backbone; "
         "backbones.minilm.public_data is not set"),
        (lambda c: c.update(privacy={"rng": "fast"}), "'fast' is not one of ['keyed', 'secure']"),
        (lambda c: c.update(privacy={"neighbouring": "swap"}), "'swap' is not one of ['replace_one', 'add_remove']"),
        (lambda c: c["merge"]["fisher"]["statistics"].pop("epsilon"),
         "merge.fisher.statistics: data: private needs clip_norm and epsilon"),
        (lambda c: c["merge"]["ties"].update(statistics={"data": "public"}),
         "merge.ties.statistics: ties uses no data statistics"),
        (lambda c: c["merge"].update(emr={"vectors": "difference"}),
         "merge.emr.vectors: emr is defined on task vectors only"),
        (lambda c: c["diagnostics"]["interpolation"].update(operator="dts_difference"),
         "'dts_difference' gives one model per task"),
        (lambda c: c["diagnostics"]["curvature"].update(operator="nope"),
         "diagnostics.curvature.operator: 'nope' is not among the configured merge operators"),
        (lambda c: c["diagnostics"]["curvature"].update(gammas=[0.5, 1.0]),
         "diagnostics.curvature.gammas: the first point must be 0"),
        (lambda c: c["backbones"]["minilm"].update(tasks=["digits"]), "is a vision task"),
        (lambda c: c["backbones"]["effnet"].update(seeds=[0, 0]), "backbones.effnet.seeds: [0, 0] has non-unique"),
        (lambda c: c.update(seeds=[0, 0]), "seeds: [0, 0] has non-unique elements; list each value once"),
        (lambda c: c.update(results=__file__), "is a file, not a folder; give a folder for the study's results"),
        (lambda c: c["backbones"]["effnet"].update(seeds=[]), "backbones.effnet.seeds: [] should be non-empty"),
        (lambda c: c.update(methods=["dpsgd"]), "dpsgd"),
        (lambda c: c["finetune"].update(by_method={"nonprivate": {"lrr": 1e-3}}),
         "finetune.by_method.nonprivate: Additional properties are not allowed ('lrr' was unexpected)"),
        (lambda c: c["backbones"]["effnet"].update(finetune={"lr": -1}), "backbones.effnet.finetune.lr"),
        (lambda c: c["backbones"]["effnet"].update(finetune={"by_method": {"dp_sam": {"rho": "big"}}}),
         "backbones.effnet.finetune.by_method.dp_sam.rho"),
        (lambda c: c.update(tables={"operator": "task_arithmetic"}),
         "tables.operator: 'task_arithmetic' is not among the configured merges"),
        (lambda c: c["sweeps"]["epsilon"].update(operators=["dare"]),
         "sweeps.epsilon.operators: 'dare' is not among the configured merges"),
        (lambda c: c["sweeps"]["rho"].update(backbones=["vit"]), "sweeps.rho.backbones: unknown backbone 'vit'"),
        (lambda c: c["sweeps"]["rho"].update(epsilon=2), "sweeps.rho.epsilon: 2 is not one of epsilons [4]"),
        (lambda c: c["sweeps"]["rho"].update(method="naive_dp"),
         "sweeps.rho.method: unknown method 'naive_dp'; methods that take rho: dp_sam, dp_merging, dp_sat, "
         "dp_sat_anchor"),
        (lambda c: c["sweeps"]["epsilon"].update(methods=["nonprivate"]),
         "sweeps.epsilon.methods: unknown method 'nonprivate'; private methods that release a task vector: "
         "naive_dp, dp_sam, dp_anchor, dp_merging, dp_sat, dp_sat_anchor"),
        (lambda c: c["diagnostics"]["landscape"].update(operator="dts_difference"),
         "diagnostics.landscape.operator: 'dts_difference' gives one model per task"),
        # merge hyperparameters' ranges and kinds, as every merge checks them, but before any fine-tune
        (lambda c: c["merge"]["ties"].update(density=2.0), "merge.ties: ties density must be in [0, 1], got 2.0"),
        (lambda c: c["merge"]["ties"].update(density="dense"),
         "merge.ties: merge operator 'ties': hyperparameter 'density' must be a number (default 0.2), got 'dense'"),
        (lambda c: c["merge"]["dts_difference"].update(rank_fraction=0),
         "merge.dts_difference: dts rank_fraction must be in (0, 1], got 0"),
        (lambda c: c["merge"].update(wudi={"iterations": 2.5}), "hyperparameter 'iterations' must be a whole number"),
    ],
)
def test_bad_config_is_refused_naming_the_field(change, message):
    config = yaml.safe_load(yaml.safe_dump(TINY))
    change(config)
    with pytest.raises((ConfigError, WorkflowError)) as refused:
        check_config(config)
    assert message in str(refused.value)


def test_a_schema_violation_is_one_line_naming_the_field_and_the_closest_key():
    config = yaml.safe_load(yaml.safe_dump(TINY))
    config["seedz"] = [0]
    with pytest.raises(ConfigError) as refused:
        check_config(config)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and "did you mean 'seeds' instead of 'seedz'?" in message
    assert "(allowed here: ace_study, audit, backbones, checkpoint_every," in message
    config = yaml.safe_load(yaml.safe_dump(TINY))
    config["data"]["max_train"] = "many"
    with pytest.raises(ConfigError, match=r"data\.max_train: 'many' is not of type"):
        check_config(config)


# Every refusal stops the workflow itself before any job: tests/test_bad_configs.py runs each case's dry run.


def test_the_tiny_config_passes_the_checks_and_gets_the_schema_defaults():
    config = yaml.safe_load(yaml.safe_dump(TINY))
    check_config(config)
    assert config["checkpoint_every"] == 10 and config["finetune"]["clip_norm"] > 0
