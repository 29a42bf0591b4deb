"""The suite's tiers, as pytest markers (registered in pyproject.toml):

- `workflow`: the test starts Snakemake (a run or a dry run). Applied here, at collection: a test is one when its
  body, a fixture it asks for or a function of its module they call names what starts Snakemake
  (workflow_runs: SNAKEMAKE, snakemake, dry_runs, job_counts; or `python -m snakemake`), so a new workflow test
  is marked without anyone remembering to.
- `system`: the test needs the machine beyond Python (Slurm daemons, a headless browser, virtual environments of
  other Pythons): marked in its module.
- `slow`: a unit test that took more than about half a second with the fast tier's two workers (or a second
  alone): marked where it is defined, so the fast tier stays under a minute.

`make test-fast` runs what is none of these; `make test` (the README's command, CI) runs everything.
"""

import ast
import inspect
from functools import cache
from pathlib import Path

import pytest

STARTS_SNAKEMAKE = {"SNAKEMAKE", "snakemake", "dry_runs", "job_counts"}


@cache
def _workflow_functions(path: str) -> frozenset[str]:
    """Module-level functions of the file at `path` that start Snakemake, directly or through one another."""
    tree = ast.parse(Path(path).read_text())
    names = {node.name: {n.id if isinstance(n, ast.Name) else "snakemake" for n in ast.walk(node)
                         if isinstance(n, ast.Name) or isinstance(n, ast.Constant) and n.value == "snakemake"}
             for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    starting = {name for name, used in names.items() if used & STARTS_SNAKEMAKE}
    while True:
        more = {name for name, used in names.items() if used & starting} - starting
        if not more:
            return frozenset(starting)
        starting |= more


def _starts_snakemake(function) -> bool:
    try:
        path = inspect.getsourcefile(function)
    except TypeError:
        return False
    return path is not None and function.__name__ in _workflow_functions(path)


def pytest_collection_modifyitems(config, items):
    for item in items:
        functions = [getattr(item, "function", None)]
        for name in item.fixturenames:
            for definition in item._fixtureinfo.name2fixturedefs.get(name, ()):
                functions.append(definition.func)
        if any(function is not None and _starts_snakemake(function) for function in functions):
            item.add_marker(pytest.mark.workflow)
