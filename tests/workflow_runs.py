"""How the tests start the real workflow: this repository's Snakefile, run by this Python, with the package
importable by the jobs even without an installed copy."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile")]


def snakemake_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "workflow"), **extra}
