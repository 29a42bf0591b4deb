"""How the tests start the real workflow: this repository's Snakefile, run by this Python, with the package
importable by the jobs even without an installed copy."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile")]


def snakemake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "workflow"), **extra}


# One process imports Snakemake (about a second) and forks a child per dry run: each child parses the workflow
# from scratch, as `snakemake -n` would, without paying the import again.
_FORKED_DRY_RUNS = r"""
import os, sys
from snakemake.cli import main

snakefile, workdirs = sys.argv[1], sys.argv[2:]
for workdir in workdirs:
    pid = os.fork()
    if pid == 0:
        out = os.open(os.path.join(workdir, "dry_run.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        code = 1
        try:
            main(["--snakefile", snakefile, "--directory", workdir, "--cores", "2", "-n"])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(workdir, "dry_run.rc"), "w") as handle:
        handle.write(str(os.waitstatus_to_exitcode(status)))
"""


def dry_runs(workdirs: list[Path]) -> list[tuple[int, str]]:
    """(return code, output) of `snakemake -n` in each of `workdirs` (each holding its config.yaml), in order."""
    import subprocess

    subprocess.run([sys.executable, "-c", _FORKED_DRY_RUNS, str(ROOT / "Snakefile"), *map(str, workdirs)],
                   env=snakemake_env(), check=True)
    return [(int((w / "dry_run.rc").read_text()), (w / "dry_run.out").read_text()) for w in workdirs]
