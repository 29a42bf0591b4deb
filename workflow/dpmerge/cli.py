"""Command line interface: one subcommand per pipeline stage (`dpmerge --help`).

Every Snakemake rule calls one of these; each also works by hand on files a researcher already has. The parser
(cli_arguments.py) names, for every command, the stage function that runs it and gives each flag the stage's
keyword as its dest, so the parsed flags are handed over as they are; the stage checks them (one place for every
check, whoever calls it). A stage's ValueError or FileNotFoundError becomes an `error: ...` exit.
"""

from __future__ import annotations

import importlib
import sys

from dpmerge import runtime
from dpmerge.cli_arguments import build_parser

# Not arguments of any stage: which command and stage, and the process's torch threads (set here, once)
PARSER_ONLY = ("command", "stage", "threads")


def stage_function(stage: str):
    """'merge.merge' -> dpmerge.stages.merge.merge."""
    module, _, function = stage.rpartition(".")
    return getattr(importlib.import_module(f"dpmerge.stages.{module}"), function)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    runtime.tune_allocator()
    runtime.make_torchvision_importable()
    if getattr(args, "threads", None) is not None:
        runtime.set_threads(args.threads)
    run = stage_function(args.stage)
    try:
        run(**{name: value for name, value in vars(args).items() if name not in PARSER_ONLY})
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
