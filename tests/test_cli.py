"""The dpmerge command line: --help everywhere, merge on real files, clear errors on bad input."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpmerge.artifacts import PRIVACY_FIELDS, load_tensors, save_released, save_tensors, tensors_sha256
from dpmerge.cli import build_parser, main

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dpmerge.cli", *args], capture_output=True, text=True)


def test_version_is_the_installed_distributions():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"dpmerge {pyproject['project']['version']}"
    assert pyproject["project"]["license"] == "MIT" and (Path(__file__).parents[1] / "LICENSE").is_file()



def test_every_command_hands_its_flags_to_its_stage_by_name():
    """The parser names each command's stage and gives every flag the stage's keyword: no flag the stage does not
    take, no required keyword without a flag (the face copies nothing field by field)."""
    import inspect

    from dpmerge.cli import PARSER_ONLY, stage_function

    sub = build_parser()._subparsers._group_actions[0]
    for command, parser in sub.choices.items():
        handed = ({a.dest for a in parser._actions if a.dest != "help"} | set(parser._defaults)) - set(PARSER_ONLY)
        parameters = inspect.signature(stage_function(parser._defaults["stage"])).parameters
        required = {name for name, p in parameters.items() if p.default is inspect.Parameter.empty}
        assert handed <= set(parameters), (command, sorted(handed - set(parameters)))
        assert required <= handed, (command, sorted(required - handed))


def test_structured_flags_are_parsed_into_what_the_stage_takes():
    args = build_parser().parse_args(["merge", "a", "b", "--base", "w0", "-o", "m", "--method", "ties",
                                      "--param", "density=0.3", "--param", "merge_func=sum", "--param", "k=x"])
    assert args.operator == "ties" and args.params == {"density": 0.3, "merge_func": "sum", "k": "x"}
    args = build_parser().parse_args(["answer", "--table1", "effnet, eps = 4=t.parquet", "--ledger", "l.json",
                                      "--out-markdown", "a.md", "--out-rst", "a.rst"])
    assert args.tables == {"effnet, eps = 4": "t.parquet"}


@pytest.mark.parametrize("argv, message", [
    (["merge", "a", "--base", "w0", "-o", "m", "--method", "ties", "--param", "density"], "--param expects key=value"),
    (["evaluate", "--backbone-spec", "[1]", "--base", "w0", "--heads", "h", "--data", "d", "-o", "x"],
     "argument --backbone-spec: must be a JSON object"),
    (["evaluate", "--backbone-spec", "{", "--base", "w0", "--heads", "h", "--data", "d", "-o", "x"],
     "argument --backbone-spec: not valid JSON"),
])
def test_a_malformed_structured_flag_is_one_line_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err

def test_every_command_has_help(capsys):
    assert run_cli("--help").returncode == 0  # the real entry point once; each command's help in process
    for command in COMMANDS:
        with pytest.raises(SystemExit) as stop:
            main([command, "--help"])
        assert stop.value.code == 0, command
        shown = capsys.readouterr().out
        assert "usage: dpmerge " + command in shown and "%%" not in shown, command  # an escaped % shows as %


def _listed_commands(capsys) -> dict[str, list[str]]:
    """The top-level --help's command groups: heading -> the commands listed under it, in order."""
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    shown = capsys.readouterr().out
    assert "{prepare," not in shown  # argparse's flat list of every command is gone
    groups, heading = {}, None
    for line in shown.splitlines():
        if line.startswith(("Commands for researchers", "Pipeline steps")):
            heading = line
            groups[heading] = []
        elif heading and (entry := re.match(r"^  ([a-z][\w-]*)\s{2,}\S", line)):
            groups[heading].append(entry.group(1))
        elif not line.strip():
            heading = None
    return groups


def test_top_level_help_lists_researchers_commands_apart_from_pipeline_steps(capsys):
    groups = _listed_commands(capsys)
    assert [h.split(" (")[0] for h in groups] == ["Commands for researchers", "Pipeline steps"]
    listed = [name for names in groups.values() for name in names]
    assert sorted(listed) == COMMANDS  # each command once, none missing, none unknown
    researchers, steps = groups.values()
    assert {"merge", "ledger", "make-standins"} <= set(researchers) and {"finetune", "prepare"} <= set(steps)


def _subparsers():
    import argparse

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_argument_of_every_command_has_help():
    import argparse

    silent = [f"{command} {(action.option_strings or [action.dest])[-1]}"
              for command, subparser in _subparsers().items() for action in subparser._actions
              if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert not silent, silent


def _example(help_text: str) -> list[str]:
    """The argv of the example a --help ends with: its lines after 'Example:', backslash continuations joined."""
    import shlex

    head, marker, example = help_text.rpartition("\nExample:\n")
    assert marker, "no example"
    lines = example.rstrip("\n").split("\n")
    assert all(line.startswith("  ") for line in lines), "the example is not the help's last block"
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    return shlex.split(" ".join(line.removesuffix("\\").strip() for line in lines))


def test_every_researchers_command_help_ends_with_an_example_the_parser_accepts(capsys):
    researchers = next(iter(_listed_commands(capsys).values()))
    commands = _subparsers()
    for command in researchers:
        argv = _example(commands[command].format_help())
        assert argv[:2] == ["dpmerge", command], argv
        # the real parser: an option misspelt, missing or of the wrong type exits here and fails the test
        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{command}'s example does not parse: {' '.join(argv)}\n{capsys.readouterr().err}")
        assert args.command == command


def test_statistics_help_says_held_out_data_is_private():
    texts = {command: " ".join(subparser.format_help().split()) for command, subparser in _subparsers().items()}
    assert "Data held out of a private training set (its test or validation split) is private" in texts["statistics"]
    # "public data (held out of private training, free)" was the old wording: held-out data is never free
    wrong = re.compile(r"public data \(held[- ]out|held[- ]out[^.;]{0,60}\b(free|no privacy (cost|budget))\b")
    assert not {command: m.group(0) for command, text in texts.items() if (m := wrong.search(text))}


def _flags_without_default(help_text: str, flags: list[str]) -> list[str]:
    silent = []
    for flag in flags:
        # the flag's block: from its line to the next line that starts another option
        block = re.search(rf"^  (?:-\w(?: \S+)?, )?{re.escape(flag)}\b.*?(?=^  -|\Z)", help_text, re.M | re.S)
        if block is None or "default" not in block.group(0):
            silent.append(flag)
    return silent


def test_every_optional_flag_shows_its_default():
    import argparse

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    silent = []
    for command, subparser in commands.items():
        optional = [a.option_strings[-1] for a in subparser._actions
                    if a.option_strings and not a.required and not isinstance(a, argparse._HelpAction)]
        silent += [f"{command} {flag}" for flag in _flags_without_default(subparser.format_help(), optional)]
    assert not silent, silent


@pytest.mark.slow
@pytest.mark.parametrize("script", ["dp_step.py", "gpu_readiness.py", "merge_memory.py", "spectral_compute.py",
                                    "startup.py"])
def test_every_benchmark_flag_shows_its_default(script):
    path = Path(__file__).parents[1] / "bench" / script
    result = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(path.parents[1] / "workflow")})
    assert result.returncode == 0, result.stderr
    flags = [f for f in re.findall(r"^  (?:-\w, )?(--[\w-]+)", result.stdout, re.M) if f != "--help"]
    assert flags and not _flags_without_default(result.stdout, flags)


@pytest.mark.slow
@pytest.mark.parametrize("label,hparams,message", [
    ("dp_merging-rho0.1", '{"rho": 0.2}', "--method dp_merging-rho0.1 says rho = 0.1, but --hparams gives 0.2"),
    ("dp_merging-lambda0.5", "{}", "says anchor_lambda = 0.5, but --hparams gives no value"),
    ("dp_merging-sigma2", "{}", "expected <method>-<rho|lambda|lr|B|wd><value>"),
    ("dpsgd", "{}", "unknown method 'dpsgd'"),
])
def test_finetune_refuses_a_sweep_label_its_settings_contradict(tmp_path, label, hparams, message):
    result = run_cli("finetune", "--backbone", "x", "--backbone-spec", "{}", "--data", str(tmp_path / "none.pt"),
                     "--method", label, "--hparams", hparams, "--study-key", str(tmp_path / "key"),
                     "--out-vector", str(tmp_path / "v"),
                     "--out-head", str(tmp_path / "h"))
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_sweep_labels_round_trip():
    from dpmerge.methods import parse_label, sweep_label

    assert parse_label("naive_dp") == ("naive_dp", {})
    assert parse_label(sweep_label("dp_merging", "rho", 0.1)) == ("dp_merging", {"rho": 0.1})
    assert parse_label(sweep_label("dp_anchor", "anchor_lambda", 1e-5)) == ("dp_anchor", {"anchor_lambda": 1e-5})


def w0():
    return {"w": torch.tensor([1.0, 1.0, 1.0]), "b": torch.tensor([0.5])}


def record(**overrides):
    base = {field: 0 for field in PRIVACY_FIELDS}
    base.update(method="naive_dp", target_epsilon=4.0, spent_epsilon=3.9, delta=1e-3, seed=0,
                pretrained_sha256="abc", accountant="rdp", sampling="poisson", w0_sha256=tensors_sha256(w0()))
    base.update(overrides)
    return base


@pytest.fixture
def released(tmp_path):
    base = w0()
    save_tensors(tmp_path / "w0.safetensors", base, {"pretrained_sha256": "abc", "w0_sha256": tensors_sha256(base)})
    vectors = [{"w": torch.tensor([1.0, -2.0, 0.0]), "b": torch.tensor([1.0])},
               {"w": torch.tensor([3.0, 2.0, 1.0]), "b": torch.tensor([-1.0])}]
    paths = []
    for index, vector in enumerate(vectors):
        path = tmp_path / f"tv{index}.safetensors"
        save_released(path, vector, record(), {"backbone": "toy", "task": f"task{index}"})
        paths.append(str(path))
    return tmp_path, base, vectors, paths


def test_merge_command_writes_w0_plus_merged_vector_with_provenance(released):
    folder, base, vectors, paths = released
    out = folder / "merged.safetensors"
    main(["merge", "--method", "task_arithmetic", "--base", str(folder / "w0.safetensors"),
          "--param", "scaling=0.5", "-o", str(out), *paths])
    merged, meta = load_tensors(out)
    assert torch.allclose(merged["w"], base["w"] + 0.5 * (vectors[0]["w"] + vectors[1]["w"]))
    assert torch.allclose(merged["b"], base["b"])
    assert meta["operator"] == "task_arithmetic" and meta["hyperparameters"] == {"scaling": 0.5}
    assert meta["tasks"] == ["task0", "task1"] and len(meta["inputs"]) == 2
    assert meta["release_epsilon"] == 3.9
    assert meta["merge_name"] == "task_arithmetic" and meta["vectors"] == "task"


def test_a_merge_logs_its_progress_over_tensors_with_rate_and_eta(released, capsys):
    folder, _, _, paths = released
    main(["merge", "--method", "wudi", "--param", "iterations=3", "--base", str(folder / "w0.safetensors"),
          "-o", str(folder / "merged.safetensors"), *paths])
    # two tensors: the last one is always logged, whatever the interval
    assert re.search(r"^\[merge\] wudi: tensor 2/2, [0-9.]+s, [0-9.]+/s, eta 0s$", capsys.readouterr().out, re.M)


def test_merge_progress_counts_shared_tensors_and_passes_every_item_through(capsys):
    from dpmerge.stages.merge import logged_tensors

    items = [("a", 1), ("personal/0/mask/a", 2), ("b", 3)]
    assert list(logged_tensors(iter(items), 2, "emr", every_seconds=0)) == items
    assert re.findall(r"tensor (\d/\d)", capsys.readouterr().out) == ["1/2", "2/2"]


def test_merge_command_merges_difference_vectors_around_the_average(released):
    folder, base, vectors, paths = released
    out = folder / "merged.safetensors"
    main(["merge", "--method", "task_arithmetic", "--vectors", "difference", "--base", str(folder / "w0.safetensors"),
          "-o", str(out), *paths])
    merged, meta = load_tensors(out)
    average = {k: (vectors[0][k] + vectors[1][k]) / 2 for k in base}
    for key in base:  # sum_t d_t = 0, so task arithmetic of the differences is the weight average
        assert torch.allclose(merged[key], base[key] + average[key])
    assert meta["merge_name"] == "task_arithmetic_difference" and meta["vectors"] == "difference"


def test_the_pipeline_refuses_a_vector_without_privacy_record(released):
    folder, _, _, paths = released
    bare = folder / "bare.safetensors"
    save_tensors(bare, {"w": torch.zeros(3), "b": torch.zeros(1)}, {"task": "x"})
    with pytest.raises(SystemExit, match="privacy record lacks"):
        main(["merge", "--method", "weight_averaging", "--require-privacy-record",
              "--base", str(folder / "w0.safetensors"), "-o", str(folder / "m.safetensors"), paths[0], str(bare)])
    assert list(folder.glob("m.safetensors*")) == []


@pytest.mark.slow
def test_the_readme_example_merges_anyones_task_vectors_and_says_they_carry_no_record(tmp_path):
    """`dpmerge merge --method ties --base w0.safetensors tv1 tv2 -o m.safetensors` on plain files as anyone's
    torch code writes them (safetensors.torch.save_file, no metadata at all): merged, a warning on stderr, and a
    merged model that claims no privacy."""
    from safetensors.torch import save_file

    base = w0()
    save_file(base, str(tmp_path / "w0.safetensors"))
    vectors = [{"w": torch.tensor([1.0, -2.0, 0.0]), "b": torch.tensor([1.0])},
               {"w": torch.tensor([3.0, 2.0, 1.0]), "b": torch.tensor([-1.0])}]
    for index, vector in enumerate(vectors, start=1):
        save_file(vector, str(tmp_path / f"tv{index}.safetensors"))
    result = subprocess.run([sys.executable, "-m", "dpmerge.cli", "merge", "--method", "ties", "--base",
                             "w0.safetensors", "tv1.safetensors", "tv2.safetensors", "-o", "m.safetensors"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 of 2 task vectors carry no full privacy record (tv1.safetensors lacks method" in result.stderr
    assert "nothing checks that w0.safetensors is the w0 they were trained from" in result.stderr
    merged, meta = load_tensors(tmp_path / "m.safetensors")
    assert meta["privacy"] == "none recorded" and "release_epsilon" not in meta
    assert meta["tasks"] == ["tv1", "tv2"] and set(merged) == set(base)
    ties = main_merged(tmp_path, vectors, base)
    assert all(torch.allclose(merged[k], ties[k]) for k in base)


def main_merged(folder, vectors, base):
    from dpmerge.merge.registry import ties

    merged = ties(vectors, density=0.2, scaling=1.0)
    return {k: base[k] + merged[k] for k in base}


@pytest.mark.parametrize("make_inputs,message", [
    (lambda paths, folder: [paths[0], paths[0]], "is given twice"),
    (lambda paths, folder: [paths[0], str(folder / "." / "tv0.safetensors")], "is given twice"),
    (lambda paths, folder: [paths[0], relabelled(paths[0], folder / "copy.safetensors")],
     "holds the same tensors as"),
    (lambda paths, folder: [paths[0], another(folder, "same_task.safetensors", task="task0")],
     "are both task vectors of task 'task0'"),
    (lambda paths, folder: [paths[0]], "a merge needs at least two task vectors, got 1"),
    (lambda paths, folder: [paths[0], another(folder, "over.safetensors", spent_epsilon=50.0)],
     "its record spends epsilon 50.0, above its target 4.0"),
])
def test_inputs_that_are_not_a_merge_are_refused_naming_them(released, make_inputs, message):
    folder, _, _, paths = released
    inputs = make_inputs(paths, folder)
    for require in ([], ["--require-privacy-record"]):
        with pytest.raises(SystemExit, match=re.escape(message)):
            main(["merge", "--method", "weight_averaging", *require, "--base", str(folder / "w0.safetensors"),
                  "-o", str(folder / "m.safetensors"), *inputs])
        assert list(folder.glob("m.safetensors*")) == []


def relabelled(path, target):
    """The same tensors under another task's name: one task counted twice."""
    tensors, meta = load_tensors(path)
    save_released(target, tensors, {**meta, "task": "renamed"})
    return str(target)


def another(folder, name, task="other", **overrides):
    path = folder / name
    save_released(path, {"w": torch.tensor([0.5, 0.5, 0.5]), "b": torch.tensor([0.0])}, record(**overrides),
                  {"backbone": "toy", "task": task})
    return str(path)


def test_a_single_vector_merges_when_asked(released):
    folder, base, vectors, paths = released
    main(["merge", "--method", "weight_averaging", "--allow-single", "--base", str(folder / "w0.safetensors"),
          "-o", str(folder / "m.safetensors"), paths[0]])
    merged, _ = load_tensors(folder / "m.safetensors")
    assert torch.allclose(merged["w"], base["w"] + vectors[0]["w"])


@pytest.mark.slow
@pytest.mark.parametrize("param,message", [
    ("density=abc", "hyperparameter 'density' must be a number (default 0.2), got 'abc'"),
    ("merge_func=3", "hyperparameter 'merge_func' must be a word (default 'mean'), got 3"),
])
def test_a_hyperparameter_of_the_wrong_kind_is_named(released, param, message):
    folder, _, _, paths = released
    result = run_cli("merge", "--method", "ties", "--param", param, "--base", str(folder / "w0.safetensors"),
                     "-o", str(folder / "m.safetensors"), *paths)
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_merge_names_unknown_operator_and_hyperparameter(released):
    folder, _, _, paths = released
    common = ["--base", str(folder / "w0.safetensors"), "-o", str(folder / "m.safetensors"), *paths]
    with pytest.raises(SystemExit, match="known operators"):
        main(["merge", "--method", "fishr", *common])
    with pytest.raises(SystemExit, match=r"fisher needs --statistics \(from 'dpmerge statistics --kind fisher'\)"):
        main(["merge", "--method", "fisher", *common])
    with pytest.raises(SystemExit, match="ties uses no data statistics; drop --statistics"):
        main(["merge", "--method", "ties", "--statistics", str(folder / "w0.safetensors"), *common])
    with pytest.raises(SystemExit, match="allowed: density, merge_func, scaling, topk_scope"):
        main(["merge", "--method", "ties", "--param", "lambda=1", *common])



def test_statistics_of_other_vectors_are_refused_naming_the_vector(released):
    """The statistics file records the content hash of each vector it was computed from; a merge compares those
    with the hashes of the vectors it merges (each vector hashed once) and names the first that differs."""
    from dpmerge.artifacts import file_tensors_sha256

    folder, _, vectors, paths = released
    stats = folder / "fisher.safetensors"
    records = [{"task": "task0", "task_vector_sha256": file_tensors_sha256(paths[0])},
               {"task": "task1", "task_vector_sha256": "0" * 64}]
    save_tensors(stats, {f"{i}/{k}": torch.ones_like(v) for i, vector in enumerate(vectors) for k, v in vector.items()},
                 {"artifact": "merge_statistics", "kind": "fisher", "source": "public", "tasks": ["task0", "task1"],
                  "records": records})
    with pytest.raises(SystemExit, match=f"{stats} was computed from another task vector than {paths[1]}"):
        main(["merge", "--method", "fisher", "--statistics", str(stats), "--base", str(folder / "w0.safetensors"),
              "-o", str(folder / "m.safetensors"), *paths])
    assert not (folder / "m.safetensors").exists()

@pytest.mark.parametrize(
    "vector,message",
    [
        ({"w": torch.tensor([1.0, float("inf"), 0.0]), "b": torch.tensor([1.0])}, "tensor 'w' contains NaN or Inf"),
        ({"w": torch.zeros(3)}, "lacks tensors that"),
        ({"w": torch.zeros(3), "b": torch.zeros(1), "c": torch.zeros(1)}, "has tensors that"),
        ({"w": torch.zeros(4), "b": torch.zeros(1)}, "tensor 'w' has shape (4,)"),
        ({"w": torch.zeros(3, dtype=torch.float64), "b": torch.zeros(1)}, "tensor 'w' has dtype"),
    ],
)
def test_bad_task_vector_is_named_and_no_output_is_left(released, vector, message):
    folder, _, _, paths = released
    bad = folder / "bad.safetensors"
    save_released(bad, vector, record(), {"backbone": "toy", "task": "bad"})
    out = folder / "m.safetensors"
    with pytest.raises(SystemExit, match=re.escape(message)) as error:
        main(["merge", "--method", "ties", "--base", str(folder / "w0.safetensors"), "-o", str(out),
              paths[0], str(bad)])
    assert str(bad) in str(error.value)
    assert not out.exists() and list(folder.glob("m.safetensors*")) == []


def test_vectors_from_other_pretrained_weights_are_refused(released):
    folder, _, _, paths = released
    foreign = folder / "foreign.safetensors"
    save_released(foreign, {"w": torch.zeros(3), "b": torch.zeros(1)}, record(pretrained_sha256="def"),
                  {"backbone": "toy", "task": "foreign"})
    with pytest.raises(SystemExit, match="pretrained_sha256"):
        main(["merge", "--method", "weight_averaging", "--base", str(folder / "w0.safetensors"),
              "-o", str(folder / "m.safetensors"), paths[0], str(foreign)])


def test_released_artifact_without_record_is_never_written(tmp_path):
    incomplete = record()
    del incomplete["spent_epsilon"]
    with pytest.raises(ValueError, match="spent_epsilon"):
        save_released(tmp_path / "tv.safetensors", {"w": torch.zeros(1)}, incomplete)
    assert not (tmp_path / "tv.safetensors").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left behind either


def merge_with_base(folder, base, paths, out):
    return ["merge", "--method", "task_arithmetic", "--base", str(base), "-o", str(out), *paths]


def forged_base(folder, tensors, metadata=None):
    """A w0 with the metadata of the real one (or `metadata`) and other tensors."""
    path = folder / "forged.safetensors"
    save_tensors(path, tensors, {"pretrained_sha256": "abc"} if metadata is None else metadata)
    return path


@pytest.mark.parametrize("make_base,message", [
    # the label the old check compared is right, the weights are not
    (lambda folder: forged_base(folder, {"w": torch.ones(3), "b": torch.ones(1)}), "is not the w0"),
    # and with the real w0's own content hash copied too: the file's tensors are hashed, not its labels
    (lambda folder: forged_base(folder, {"w": torch.ones(3), "b": torch.ones(1)},
                                {"pretrained_sha256": "abc", "w0_sha256": tensors_sha256(w0())}),
     "the file changed since 'dpmerge pretrained' wrote it"),
    (lambda folder: forged_base(folder, {"w": torch.tensor([1.0, float("nan"), 1.0]), "b": torch.tensor([0.5])}),
     "tensor 'w' contains NaN or Inf"),
    (lambda folder: forged_base(folder, {"w": torch.tensor([1.0, 1.0, float("inf")]), "b": torch.tensor([0.5])}),
     "tensor 'w' contains NaN or Inf"),
    (lambda folder: forged_base(folder, w0(), {"pretrained_sha256": "def"}), "records 'def'"),
    (lambda folder: forged_base(folder, w0(), {}), "records None"),
    (lambda folder: cut(folder / "w0.safetensors", 100), "not a valid safetensors file"),
    (lambda folder: cut(folder / "w0.safetensors", 5), "header too small"),
])
def test_a_base_that_is_not_the_vectors_w0_is_refused_naming_it(released, make_base, message):
    folder, _, _, paths = released
    base = make_base(folder)
    out = folder / "m.safetensors"
    with pytest.raises(SystemExit, match=re.escape(message)) as error:
        main(merge_with_base(folder, base, paths, out))
    assert str(base) in str(error.value) and str(error.value).startswith("error: ")
    assert list(folder.glob("m.safetensors*")) == []


def cut(path, size):
    """A copy of `path` cut after `size` bytes, as `head -c` makes one."""
    copy = path.with_name(f"cut{size}.safetensors")
    copy.write_bytes(path.read_bytes()[:size])
    return copy


def test_the_real_w0_merges_and_is_recorded_as_an_input(released):
    folder, base, _, paths = released
    main(merge_with_base(folder, folder / "w0.safetensors", paths, folder / "m.safetensors"))
    _, meta = load_tensors(folder / "m.safetensors")
    # named relative to the folder it shares with the merged model, never by this machine's absolute path
    assert meta["base"] == {"path": "w0.safetensors", "sha256": tensors_sha256(base)}


def test_a_vector_that_records_no_w0_hash_is_refused(released):
    folder, _, _, paths = released
    older = folder / "older.safetensors"
    unrecorded = record()
    del unrecorded["w0_sha256"]
    save_released(older, {"w": torch.zeros(3), "b": torch.zeros(1)}, unrecorded, {"backbone": "toy", "task": "old"})
    with pytest.raises(SystemExit, match=f"{re.escape(str(older))} records no w0_sha256"):
        main(merge_with_base(folder, folder / "w0.safetensors", [paths[0], str(older)], folder / "m.safetensors"))


@pytest.mark.slow
def test_a_corrupt_input_is_an_error_naming_it_not_a_traceback(released):
    folder, _, _, paths = released
    for corrupt in (cut(folder / "w0.safetensors", 100), cut(folder / "w0.safetensors", 2)):
        for argv in (merge_with_base(folder, corrupt, paths, folder / "m.safetensors"),
                     merge_with_base(folder, folder / "w0.safetensors", [paths[0], str(corrupt)],
                                     folder / "m.safetensors")):
            result = run_cli(*argv)
            assert result.returncode == 1, result.stderr
            assert result.stderr.startswith(f"error: {corrupt}: not a valid safetensors file"), result.stderr
            assert "Traceback" not in result.stderr
            assert list(folder.glob("m.safetensors*")) == []
