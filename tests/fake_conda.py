"""A stand-in for the `conda` command, for checking `snakemake --sdm conda` where conda is not installed.

It answers what Snakemake asks before it deploys (`info --json`, `--version`, the channel priority), accepts the
`clean` that follows a create, and for `env create` creates no environment: it reads the env file Snakemake hands
it and records where the pip step would install each editable (`-e`) requirement from, as conda and pip would
find it: conda runs pip in the env file's directory (conda/env/installers/pip.py), pip expands `${NAME}` from the
environment in a requirements file and reads a relative path from its working directory. Every call is appended,
as JSON, to the file named by FAKE_CONDA_LOG; any other command fails.
"""

import json
import os
import re
import sys
from pathlib import Path

import yaml


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def editable_targets(env_file: Path) -> list[str]:
    """The directories the env's `-e` pip requirements name, as pip would resolve them."""
    spec = yaml.safe_load(env_file.read_text())
    pip = [line for entry in spec["dependencies"] if isinstance(entry, dict) for line in entry.get("pip", [])]
    targets = []
    for line in pip:
        if line.startswith(("-e ", "--editable ")):
            target = line.split(None, 1)[1]
            # pip's rule: ${NAME} of upper-case letters, digits and underscores; an unset variable stays as is
            target = re.sub(r"\$\{([A-Z0-9_]+)\}", lambda m: os.environ.get(m[1], m[0]), target)
            targets.append(os.path.normpath(os.path.join(env_file.parent, target)))
    return targets


def main(args: list[str]) -> int:
    record = {"args": args}
    if args == ["--version"]:
        print("conda 25.1.1")
    elif args[:2] == ["info", "--json"]:
        print(json.dumps({"conda_prefix": os.environ["FAKE_CONDA_PREFIX"], "platform": "linux-64"}))
    elif args[:3] == ["config", "--get", "channel_priority"]:
        print(json.dumps({"get": {"channel_priority": "strict"}}))
    elif args[:1] == ["clean"]:
        pass  # Snakemake's --conda-cleanup-pkgs after a create: nothing was downloaded
    elif args[:2] == ["env", "create"]:
        env_file = Path(option(args, "--file"))
        record["env_file"] = str(env_file)
        record["editable"] = editable_targets(env_file)
        Path(option(args, "--prefix"), "bin").mkdir(parents=True)
    else:
        print(f"fake conda: no stand-in for `conda {' '.join(args)}`", file=sys.stderr)
        return 1
    with open(os.environ["FAKE_CONDA_LOG"], "a") as log:
        log.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
