"""dpmerge limits how long libgomp's idle workers spin, before torch loads it, unless the user chose."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpmerge.openmp_wait import SPIN_COUNT, limit_spinning

WORKFLOW = Path(__file__).resolve().parents[1] / "workflow"


def test_the_spin_count_is_set_unless_the_user_chose_one():
    environment = {}
    limit_spinning(environment)
    assert environment == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
    for chosen in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        environment = dict(chosen)
        limit_spinning(environment)
        assert environment == chosen


# A command that gets as far as its stage (which imports torch) and then stops on a missing input
RUNS_A_STAGE = ["drift", "--base", "nowhere.safetensors", "--task-vectors", "nowhere.safetensors", "-o", "x.parquet"]


def _spin_count_torch_loads_with(environment: dict, argv=RUNS_A_STAGE) -> str:
    """Run the `dpmerge` entry point with `argv` and report GOMP_SPINCOUNT as it stood at the moment torch was
    first imported: libgomp reads it then and never again."""
    watch = textwrap.dedent("""
        import importlib.abc, os, sys
        seen = []
        class FirstTorchImport(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" and not seen:
                    seen.append(os.environ.get("GOMP_SPINCOUNT", "unset"))
        sys.meta_path.insert(0, FirstTorchImport())
        sys.argv = ["dpmerge", *ARGV]
        from dpmerge import launch
        try:
            launch.main()
        except SystemExit:
            pass
        print("torch loaded with GOMP_SPINCOUNT", seen[0] if seen else "never")
    """)
    result = subprocess.run([sys.executable, "-c", f"ARGV = {argv!r}\n" + watch], env=environment,
                            capture_output=True, text=True, timeout=300, check=True)
    return result.stdout.strip().splitlines()[-1].rsplit(" ", 1)[-1]


@pytest.mark.slow
def test_the_dpmerge_command_sets_it_before_torch_loads():
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "DPMERGE_FORKSERVER")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKFLOW), environment.get("PYTHONPATH")]))
    assert _spin_count_torch_loads_with(environment) == str(SPIN_COUNT)
    assert _spin_count_torch_loads_with({**environment, "GOMP_SPINCOUNT": "123"}) == "123"


def test_help_loads_no_torch():
    """`dpmerge --help` and a command's --help parse only: no stage, so no torch, is imported."""
    environment = {name: value for name, value in os.environ.items() if name != "DPMERGE_FORKSERVER"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKFLOW), environment.get("PYTHONPATH")]))
    assert _spin_count_torch_loads_with(environment, ["--help"]) == "never"
    assert _spin_count_torch_loads_with(environment, ["merge", "--help"]) == "never"
