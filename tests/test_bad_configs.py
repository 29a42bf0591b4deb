"""Bad configurations, each stopped before any job with one line that names the field and says the fix: by the
check itself, and by the workflow (a dry run that plans nothing and creates no results folder)."""

import pytest
import yaml

from dpmerge.config_check import ConfigError, check_config
from workflow_runs import TINY, dry_runs


def _own_table(tmp_path, rows: str, name="mine.csv"):
    path = tmp_path / name
    path.write_text(rows)
    return str(path)


def _own_task(config, entry, backbone="minilm"):
    config["own_tasks"] = {"mine": entry}
    config["backbones"][backbone]["tasks"] = [config["backbones"][backbone]["tasks"][0], "mine"]


def _small_images(tmp_path, per_class=3):
    from PIL import Image

    for label in ("a", "b"):
        for i in range(per_class):
            folder = tmp_path / "images" / label
            folder.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(folder / f"{i}.png")
    return str(tmp_path / "images")


def _one_line(message: str) -> bool:
    return len(message.splitlines()) == 1


# (id, change(config, tmp_path), the field the message names, the fix it gives)
BAD = [
    ("duplicate seeds", lambda c, t: c.update(seeds=[0, 0]), "seeds", "list each value once"),
    ("duplicate backbone seeds", lambda c, t: c["backbones"]["effnet"].update(seeds=[1, 1]),
     "backbones.effnet.seeds", "list each value once"),
    ("results is a file", lambda c, t: c.update(results=__file__), "results", "give a folder"),
    ("batch size above N", lambda c, t: c["finetune"].update(batch_size=1_000_000_000),
     "finetune.batch_size", "give at most 48"),
    ("a method's batch size above N",
     lambda c, t: c["finetune"].update(by_method={"dp_merging": {"batch_size": 49}}),
     "finetune.by_method.dp_merging.batch_size", "give at most 48"),
    ("delta above 1/N", lambda c, t: c["finetune"].update(delta=0.5), "finetune.delta",
     "Give at most 0.0208333"),
    ("a backbone's delta above 1/N", lambda c, t: c["backbones"]["effnet"]["finetune"].update(delta=0.03),
     "backbones.effnet.finetune.delta", "leave delta unset"),
    ("own task with one class",
     lambda c, t: _own_task(c, {"table": _own_table(t, "text,label\n" + "a b c,x\n" * 30)}),
     "own_tasks.mine.table", "a classification task needs two or more"),
    ("own task without its label column",
     lambda c, t: _own_task(c, {"table": _own_table(t, "text,topic\n" + "a b c,x\nd e f,y\n" * 15)}),
     "own_tasks.mine.table", "name the right one with own task fields text / label / text_pair"),
    ("own task whose file is missing", lambda c, t: _own_task(c, {"table": str(t / "absent.csv")}),
     "own_tasks.mine.table", "no such file"),
    ("own task file that is not a table", lambda c, t: _own_task(c, {"table": _own_table(t, "x", "mine.txt")}),
     "own_tasks.mine.table", "expected .csv, .parquet, .jsonl"),
    ("own task with an unknown field", lambda c, t: _own_task(c, {"table": _own_table(t, "text,label\n"),
                                                                  "labels": "y"}),
     "own_tasks.mine.labels", "an own task takes"),
    ("own image task smaller than the batch",
     lambda c, t: _own_task(c, {"images": _small_images(t)}, backbone="effnet"),
     "finetune.batch_size", "backbones.effnet.finetune.by_task.mine.batch_size"),
    ("a task's own batch size for a task the backbone lacks",
     lambda c, t: c["backbones"]["effnet"]["finetune"].update(by_task={"mnist5k": {"batch_size": 4}}),
     "backbones.effnet.finetune.by_task.mnist5k", "goes under the backbone that trains it"),
    ("a task's own batch size above its N",
     lambda c, t: c["backbones"]["effnet"]["finetune"].update(by_task={"digits": {"batch_size": 64}}),
     "backbones.effnet.finetune.by_task.digits.batch_size", "give at most 48"),
    ("a task's own learning rate", lambda c, t: c["backbones"]["effnet"]["finetune"].update(
        by_task={"digits": {"batch_size": 4, "lr": 0.1}}),
     "backbones.effnet.finetune.by_task.digits", "('lr' was unexpected)"),
    ("negative epsilon", lambda c, t: c.update(epsilons=[-1]), "epsilons.0", "give a number (above 0)"),
    ("misspelled key", lambda c, t: c.update(seedz=[0]), "seedz", "did you mean 'seeds' instead of 'seedz'?"),
    ("max_train as text", lambda c, t: c["data"].update(max_train="many"), "data.max_train",
     "expected a whole number or null"),
    ("checkpoint_every 0", lambda c, t: c.update(checkpoint_every=0), "checkpoint_every", "give a whole number"),
    ("negative learning rate", lambda c, t: c["backbones"]["effnet"]["finetune"].update(lr=-1),
     "backbones.effnet.finetune.lr", "give a number (above 0)"),
    ("unknown task", lambda c, t: c["backbones"]["effnet"].update(tasks=["digits", "cifar"]),
     "backbones.effnet.tasks", "known tasks: bbc_next_sentence"),
    ("vision task on a text backbone", lambda c, t: c["backbones"]["minilm"].update(tasks=["digits"]),
     "backbones.minilm.tasks", "is a vision task"),
    ("unknown merge operator", lambda c, t: c["merge"].update(fishr={}), "merge.fishr", "give `operator:` one of"),
    ("unknown merge hyperparameter", lambda c, t: c["merge"].update(ties={"densty": 0.2}), "merge.ties",
     "allowed: density"),
    ("density out of range", lambda c, t: c["merge"]["ties"].update(density=2.0), "merge.ties",
     "must be in [0, 1]"),
    ("RegMean without statistics", lambda c, t: c["merge"].update(regmean={}), "merge.regmean", "add statistics:"),
    ("held-out slice declared public", lambda c, t: c["data"].update(public_examples=16), "data.public_examples",
     "declare a public dataset outside every private training set"),
    ("unknown random source", lambda c, t: c.update(privacy={"rng": "fast"}), "privacy.rng",
     "is not one of ['keyed', 'secure']"),
    ("sweep at an unconfigured budget", lambda c, t: c["sweeps"]["rho"].update(epsilon=2), "sweeps.rho.epsilon",
     "is not one of epsilons [4]"),
    ("unknown method", lambda c, t: c.update(methods=["dpsgd"]), "methods", "known methods"),
    ("empty backbone seeds", lambda c, t: c["backbones"]["effnet"].update(seeds=[]), "backbones.effnet.seeds",
     "give a list"),
]


@pytest.mark.slow
@pytest.mark.parametrize("change,field,fix", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_the_check_names_the_field_and_the_fix(tmp_path, change, field, fix):
    config = yaml.safe_load(yaml.safe_dump(TINY))
    change(config, tmp_path)
    with pytest.raises(ConfigError) as refused:
        check_config(config)
    message = str(refused.value)
    assert _one_line(message), message
    assert field in message and fix in message, message


def test_there_are_at_least_25_cases():
    assert len(BAD) >= 25 and len({case[0] for case in BAD}) == len(BAD)


def test_the_workflow_stops_before_any_job_for_every_case(tmp_path):
    """Each case's dry run (one Snakemake import, a fresh parse per case): refused, one short message naming the
    field and the fix, no traceback, no results folder."""
    workdirs = []
    for number, (_, change, _, _) in enumerate(BAD):
        workdir = tmp_path / f"case{number}"
        workdir.mkdir()
        config = yaml.safe_load(yaml.safe_dump(TINY))
        change(config, workdir)
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
        workdirs.append(workdir)
    control = tmp_path / "good"  # the same runner plans the good configuration's jobs
    control.mkdir()
    (control / "config.yaml").write_text(yaml.safe_dump(TINY))
    *refused, (code, output) = dry_runs([*workdirs, control])
    assert code == 0 and "finetune" in output, output[-2000:]
    for (case, _, field, fix), workdir, (code, output) in zip(BAD, workdirs, refused):
        assert code != 0, case
        assert field in output and fix in output, (case, output[-2000:])
        assert "Traceback" not in output and len(output.splitlines()) < 40, (case, output[-2000:])
        assert not (workdir / "results").exists(), case
