"""The package's design rules, checked on its source: no import circles, the data's way runs down the floors,
no file over 600 lines, `import dpmerge` has no side effects, and what the Snakefile reads needs no torch.

Imports are read from the source text (every `import` / `from ... import`, also those inside functions), so a
lazy import that closes a circle is still a circle here.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workflow" / "dpmerge"
MAX_LINES = 600

# Which rooms may import which: a room's own modules, plus the rooms listed (transitively lower floors).
ROOMS_BELOW = {
    "cli": {"cli_arguments", "stages", "catalog", "config_check", "runtime"},
    # the parser: the operators and denoisers it lists from merge/specs.py, never the config check's catalog
    "cli_arguments": {"merge", "cli_help", "cli_types", "methods", "cli_merge_arguments", "cli_study_arguments"},
    "cli_study_arguments": {"merge", "cli_types", "methods"},  # the audits', mixtures' and studies' commands
    "cli_merge_arguments": {"merge", "cli_types"},  # the merge and scoring commands' flags, torch-free
    "cli_types": set(),  # argparse types, actions and the help formatter: standard library only
    "cli_help": set(),  # the top-level --help's command groups and each researcher command's example
    # the `dpmerge` entry point: through the warm fork server, or cli in this process; stdlib only at import
    "launch": {"forkserver", "cli", "gpu_slots", "openmp_wait"},
    "gpu_slots": set(),  # stdlib only: the launcher claims a job's GPU before anything heavy is imported
    "private_folders": set(),  # stdlib only: the Snakefile makes the private result folders 0700 while parsed
    "run_lock": set(),  # stdlib only: the Snakefile holds the results folder's lock from onstart on
    "openmp_wait": set(),  # stdlib only: it must run before anything imports torch
    "forkserver": {"cli", "runtime"},
    # dpmerge from Python (a notebook's face): the library's rooms, no stages, no results folders
    "api": {"training", "privacy", "merge", "models", "artifacts", "metrics", "methods", "runtime"},
    "stages": {"privacy", "merge", "checkpoints", "diagnostics", "report", "training", "models", "data", "artifacts",
               "metrics", "epsilon", "methods", "runtime", "config_sampling"},
    # the config check reads only the torch-free registries (the catalog test below holds it to that)
    "config_check": {"config_studies", "config_fields", "config_sampling", "data", "epsilon", "methods", "merge",
                     "models", "training"},
    # each fine-tune's batch size and delta against its task's N, where N is known before any job
    "config_sampling": {"config_fields", "data", "methods"},
    # the studies' sections of the config (noise_scale, mix, ace_study, denoise_study), checked after the grid's
    "config_studies": {"config_fields", "epsilon", "methods", "merge"},
    "config_fields": {"epsilon", "merge"},  # what the config checks share: their error, merge entries, budgets
    # the Snakefile's view: only the torch-free registries and helpers of the rooms it names
    "catalog": {"config_check", "config_fields", "config_sampling", "config_studies", "epsilon", "methods", "models",
                "training", "data", "merge", "report", "privacy"},
    "diagnostics": {"models", "artifacts", "metrics", "runtime"},
    "report": {"artifacts", "epsilon", "methods", "runtime"},
    "merge": {"checkpoints", "artifacts", "epsilon", "runtime"},  # pure tensor code: no data, privacy, training
    "training": {"privacy", "models", "artifacts", "epsilon", "methods", "runtime"},
    "privacy": {"models", "artifacts", "epsilon", "runtime"},  # models: private statistics run the backbone
    "models": {"artifacts", "metrics", "runtime"},
    "data": {"metrics", "runtime"},
    # checkpoints as people have them (a file, shards, a model folder), read and written in their own layout
    "checkpoints": {"artifacts", "runtime"},
    "artifacts": {"runtime"},
    "metrics": set(),
    "epsilon": set(),
    "methods": set(),  # every fine-tuning method stated once, standard library only
    "runtime": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The dpmerge modules `path` imports, resolved to modules that exist (`from pkg import mod` -> pkg.mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("dpmerge")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            elif node.module and node.module.startswith("dpmerge"):
                target = node.module
            else:
                continue
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, set(known)) for name, path in known.items()}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dpmerge"


def test_no_import_circles():
    graph = import_graph()
    state: dict[str, int] = {}
    circles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_imports_run_down_the_floors():
    climbs = []
    for module, targets in import_graph().items():
        if room(module) == "dpmerge":  # the package's __init__ imports nothing
            assert not targets, f"dpmerge/__init__.py imports {sorted(targets)}"
            continue
        allowed = ROOMS_BELOW[room(module)] | {room(module)}
        climbs += [f"{module} -> {target}" for target in sorted(targets) if room(target) not in allowed]
    assert not climbs, "imports that climb back up: " + ", ".join(climbs)


def test_every_module_is_placed_on_a_floor():
    assert {room(m) for m in modules()} - {"dpmerge"} <= set(ROOMS_BELOW)


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_file_over_600_lines(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{modules()[name]} has {lines} lines (at most {MAX_LINES}: split it by idea)"


HEAVY = ('torch', 'numpy', 'pandas', 'ctypes', 'jsonschema', 'yaml')


def fresh_import(statement: str) -> dict:
    code = (f"import sys; {statement}; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={"PYTHONPATH": str(PACKAGE.parent), "PATH": ""})
    assert result.returncode == 0, result.stderr
    return eval(result.stdout)  # noqa: S307 - our own printed list


def test_import_dpmerge_loads_nothing_heavy_and_tunes_nothing():
    assert fresh_import("import dpmerge") == []


def test_every_package_init_is_light():
    for name, path in modules().items():
        if path.name == "__init__.py":
            assert fresh_import(f"import {name}") == [], name


def test_building_the_command_line_parser_imports_neither_torch_nor_the_config_check():
    assert fresh_import("from dpmerge.cli_arguments import build_parser; build_parser()") == []


# No package function over 80 lines (issue 56): one that grows past 80 is split before it lands.
LONG_FUNCTIONS: set[str] = set()  # none left; a function over 80 lines is split before it lands


def test_no_package_function_is_over_80_lines():
    import ast

    long = {f"{path.relative_to(PACKAGE)} {node.name}" for path in modules().values()
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80}
    assert long == LONG_FUNCTIONS, f"over 80 lines: {sorted(long)} (listed: {sorted(LONG_FUNCTIONS)})"


def test_the_catalog_the_snakefile_reads_needs_no_torch():
    assert not {"torch", "numpy", "pandas"} & set(fresh_import("import dpmerge.catalog"))


# ----------------------------------------------------------------------------------------- the workflow's rules
ROOT = PACKAGE.parents[1]


def rule_files() -> list[Path]:
    """The Snakefile's includes, in its order."""
    import re

    text = (ROOT / "Snakefile").read_text()
    return [ROOT / path for path in re.findall(r'^include: "([^"]+)"', text, re.M)]


def rule_names(path: Path) -> tuple[set[str], str]:
    """The names a rules file defines at its top level (functions and constants), and its code with comments and
    docstrings taken out (a name mentioned in prose is not a use)."""
    import re

    text = path.read_text()
    defined = set(re.findall(r"^(?:def (\w+)|(\w+) =)", text, re.M))
    defined = {a or b for a, b in defined}
    code = re.sub(r'"""(?:.|\n)*?"""', "", text)
    code = re.sub(r"#[^\n]*", "", code)
    return defined, code


def test_each_rules_file_uses_only_names_of_the_files_included_above_it():
    """No circle between rule files: each one reads only what the Snakefile included before it."""
    import re

    files = rule_files()
    assert files, "the Snakefile includes no rules files"
    defined = {path: rule_names(path)[0] for path in files}
    owner = {}
    for path in files:
        for name in defined[path]:
            assert name not in owner, f"{name} is defined in both {owner[name].name} and {path.name}"
            owner[name] = path
    later_uses = []
    for index, path in enumerate(files):
        code = rule_names(path)[1]
        for later in files[index + 1:]:
            used = sorted(n for n in defined[later] if re.search(rf"\b{n}\b", code))
            later_uses += [f"{path.name} uses {name} of {later.name}" for name in used]
    assert not later_uses, "rules files that reach down the include order: " + "; ".join(later_uses)


@pytest.mark.parametrize("path", rule_files(), ids=lambda path: path.name)
def test_no_rules_file_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path} has {lines} lines (at most {MAX_LINES}: split it by concern)"


def test_every_rules_file_is_included():
    assert set(rule_files()) == set((ROOT / "workflow" / "rules").glob("*.smk"))


@pytest.mark.slow
def test_no_test_module_imports_another():
    """What tests share lives in helper modules (workflow_runs, privacy_records, brute_force, tiny_files,
    audit_toys): a test module imported for one name runs its own module-level code and fixtures in another."""
    import ast

    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert found == []
