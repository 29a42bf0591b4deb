"""The Snakemake workflow catalog's conventions (issue 19): `snakemake --lint`, `snakefmt --check` and
`ruff check` find nothing, every rule deploys its conda env under `--sdm conda`, and the Pythons the package
claims (3.11-3.13) compile its sources and build the workflow's DAG.

Where conda is not installed, `--sdm conda` runs against tests/fake_conda.py: Snakemake's own deployment code
runs (which env each job gets, the copy of the env file it hands conda, the environment it runs conda in), the
solve and the installs do not. Python 3.12 and 3.13 get the torch-free part only (no torch for them here): the
sources compile, and the Snakefile with the catalog and config checks builds the same DAG as on this Python.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from workflow_runs import ROOT, SNAKEMAKE, snakemake_env

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENV_FILE = ROOT / "envs" / "dpmerge.yaml"
SNAKEFILES = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]


def run(command, env=None, timeout=300):
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                            env=env or snakemake_env(), timeout=timeout)
    return result, result.stdout + result.stderr


def job_counts(output: str) -> dict[str, int]:
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", output, flags=re.M) if rule != "total"}


@pytest.mark.parametrize("configfile", ["config.yaml", "presets/paper_vision.yaml"])
def test_snakemake_lint_finds_nothing(configfile, tmp_path):
    result, output = run([*SNAKEMAKE, "--lint", "--directory", tmp_path, "--configfile", ROOT / configfile])
    assert result.returncode == 0 and "Congratulations" in output, output


@pytest.mark.slow
def test_snakefmt_would_change_nothing():
    # [tool.snakefmt] in pyproject.toml: line length, directive order, shell commands left as written
    result, output = run([sys.executable, "-m", "snakefmt", "--config", ROOT / "pyproject.toml", "--check",
                          "--compact-diff", *SNAKEFILES])
    assert result.returncode == 0, f"run `snakefmt Snakefile workflow/rules` to apply:\n{output}"


def test_ruff_finds_nothing():
    # [tool.ruff] in pyproject.toml: pyflakes, pycodestyle (120 columns) and import order over the package, the
    # tests and the benchmarks
    result, output = run([sys.executable, "-m", "ruff", "check", "--no-cache", ROOT])
    assert result.returncode == 0, f"run `ruff check --fix` where it can, then fix the rest:\n{output}"


@pytest.fixture
def fake_conda(tmp_path):
    """The environment for a Snakemake run whose `conda` is tests/fake_conda.py, and the file it logs to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    conda = bin_dir / "conda"
    conda.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "fake_conda.py"}" "$@"\n')
    conda.chmod(0o755)
    log = tmp_path / "conda.log"
    env = snakemake_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_CONDA_LOG=str(log),
                        FAKE_CONDA_PREFIX=str(tmp_path / "conda-base"))
    return env, log


def conda_calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_conda_dry_run_plans_every_job_in_the_one_env(tmp_path, fake_conda):
    env, log = fake_conda
    workdir = tmp_path / "run"
    result, output = run([*SNAKEMAKE, "-n", "--sdm", "conda", "--directory", workdir, "--cores", "2",
                          "--configfile", ROOT / "config.yaml"], env=env)
    assert result.returncode == 0, output
    planned = [Path(path).resolve() for path in re.findall(r"Conda environment (\S+) will be created", output)]
    assert planned == [ENV_FILE.resolve()], output
    _, plain_output = run([*SNAKEMAKE, "-n", "--directory", workdir, "--cores", "2",
                           "--configfile", ROOT / "config.yaml"])
    assert job_counts(output.split("Job stats:")[-1]) == job_counts(plain_output.split("Job stats:")[-1])
    assert all(call["args"][:2] != ["env", "create"] for call in conda_calls(log))  # a dry run creates nothing


def test_the_conda_env_installs_this_checkout_from_wherever_snakemake_copies_it(tmp_path, fake_conda):
    """The env's `-e` line, resolved as conda and pip would, from the copy Snakemake hands conda, in the
    environment Snakemake runs it in, is this checkout (a path relative to envs/ would miss it: the copy lies in
    .snakemake/conda/)."""
    env, log = fake_conda
    result, output = run([*SNAKEMAKE, "--sdm", "conda", "--conda-create-envs-only", "--directory", tmp_path / "run",
                          "--cores", "2", "--configfile", ROOT / "config.yaml"], env=env)
    assert result.returncode == 0, output
    creates = [call for call in conda_calls(log) if call["args"][:2] == ["env", "create"]]
    assert len(creates) == 1, conda_calls(log)
    copy = Path(creates[0]["env_file"])
    assert copy.parent == tmp_path / "run" / ".snakemake" / "conda" and copy.read_text() == ENV_FILE.read_text()
    assert creates[0]["editable"] == [str(ROOT)]


def test_the_conda_env_pins_what_pyproject_pins():
    spec = yaml.safe_load(ENV_FILE.read_text())
    python = next(entry for entry in spec["dependencies"] if isinstance(entry, str) and entry.startswith("python="))
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(python.removeprefix("python=") + ".0")
    pip = next(entry["pip"] for entry in spec["dependencies"] if isinstance(entry, dict))
    pinned = [line for line in pip if not line.startswith("-")]
    assert pinned and set(pinned) <= set(PYPROJECT["project"]["dependencies"])


def test_the_catalog_file_claims_what_the_workflow_has():
    usage = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    flags = usage["mandatory-flags"]["flags"].split()
    assert (ROOT / flags[flags.index("--workflow-profile") + 1] / "config.yaml").is_file()
    # conda: every rule's env (the lint above); no container image, so no apptainer
    assert usage["software-stack-deployment"] == {"conda": True, "apptainer": False, "apptainer+conda": False}
    assert "container:" not in "".join(path.read_text() for path in SNAKEFILES)
    assert usage["report"] is True and (ROOT / "workflow" / "report" / "workflow.rst").is_file()


def interpreter(version: str) -> str | None:
    """A working `pythonX.Y`: on PATH, or one that pyenv installed but does not put on PATH (its shim then fails)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


CLAIMED_PYTHONS = sorted((c.rsplit(" :: ", 1)[1] for c in PYPROJECT["project"]["classifiers"]
                          if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)),
                         key=lambda version: int(version.split(".")[1]))
OTHER_PYTHONS = [v for v in CLAIMED_PYTHONS if v != f"{sys.version_info.major}.{sys.version_info.minor}"]


def test_the_classifiers_name_exactly_the_pythons_requires_python_admits():
    admitted = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert CLAIMED_PYTHONS == [f"3.{minor}" for minor in range(30) if admitted.contains(f"3.{minor}.0")]
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in CLAIMED_PYTHONS


@pytest.fixture(scope="module", params=OTHER_PYTHONS)
def other_python(request):
    python = interpreter(request.param)
    if python is None:
        pytest.skip(f"no Python {request.param} on this machine")
    return python


# Compiles each file named in memory (no .pyc beside the sources), warnings as errors: e.g. an invalid escape
# sequence, a SyntaxWarning since 3.12
COMPILE_EACH = """
import pathlib, sys, warnings
warnings.simplefilter("error")
failed = []
for path in sys.argv[1:]:
    try:
        compile(pathlib.Path(path).read_text(encoding="utf-8"), path, "exec")
    except (SyntaxError, Warning) as error:
        failed.append(f"{path}: {error!r}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow
def test_every_source_file_compiles_on(other_python):
    sources = sorted(str(p) for folder in ("workflow", "tests", "bench") for p in (ROOT / folder).rglob("*.py"))
    result, output = run([other_python, "-c", COMPILE_EACH, *sources])
    assert result.returncode == 0, output


@pytest.fixture(scope="module")
def torch_free_venv(other_python, tmp_path_factory):
    """A virtual environment of that Python with what the Snakefile needs at parse time, at pyproject's pins:
    Snakemake, PyYAML and jsonschema (the config check). No dpmerge: the Snakefile reads its catalog from
    workflow/, as under the catalog's `--sdm conda` usage, where only the jobs' env has the package."""
    venv = tmp_path_factory.mktemp("venv")
    result, output = run([other_python, "-m", "venv", venv])
    assert result.returncode == 0, output
    wanted = {"snakemake", "pyyaml", "jsonschema"}
    pins = [d for d in PYPROJECT["project"]["dependencies"] if Requirement(d).name.lower() in wanted]
    assert len(pins) == len(wanted), pins
    result, output = run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-compile", *pins], env=dict(os.environ), timeout=600)
    assert result.returncode == 0, output
    return venv / "bin" / "python"


def dag_job_counts(python, workdir: Path) -> dict[str, int]:
    without_pythonpath = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result, output = run([python, "-m", "snakemake", "--snakefile", ROOT / "Snakefile", "-n", "--quiet", "rules",
                          "--cores", "2", "--directory", workdir, "--configfile", ROOT / "config.yaml"],
                         env=without_pythonpath)
    assert result.returncode == 0, output
    return job_counts(output)


@pytest.fixture(scope="module")
def this_pythons_dag(tmp_path_factory):
    return dag_job_counts(sys.executable, tmp_path_factory.mktemp("dag"))


def test_the_workflow_builds_the_same_dag_on(torch_free_venv, this_pythons_dag, tmp_path):
    assert dag_job_counts(torch_free_venv, tmp_path) == this_pythons_dag != {}
