"""Run the tiny end-to-end config (tests/test_pipeline.py's TINY) under a fixed study key and write the SHA-256
of every output: released task vectors and heads, merged models, statistics, scores, diagnostics, tables,
figures. Run it before and after a restructuring and `diff` the two lists: a change that moves code without
changing behaviour leaves every line identical.

    python tests/fingerprint_tiny_run.py /tmp/before      # on the old commit
    python tests/fingerprint_tiny_run.py /tmp/after       # on the new one
    diff /tmp/before/fingerprint.txt /tmp/after/fingerprint.txt

The fixed key is a test key (never a study's secret): with it the keyed randomness, and so every release,
is reproducible. Logs, benchmarks and the private folder are left out (they hold timings and paths).
Safetensors files are fingerprinted by content (every tensor's name, dtype, shape and bytes, and the metadata
with sorted keys), because the safetensors writer orders its header differently from run to run; torch files
(prepared tasks) likewise by their loaded content. Every other file by its bytes.
`python tests/fingerprint_tiny_run.py --existing DIR` fingerprints a finished run without running it.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workflow_runs import SNAKEMAKE, TINY, snakemake_env  # noqa: E402

FIXED_TEST_KEY = "ab" * 32
LEFT_OUT = ("logs", "benchmarks", "private")


def _feed(digest, value) -> None:
    """Hash a loaded torch object canonically: tensors by dtype, shape and bytes; containers in key order."""
    import torch

    if isinstance(value, torch.Tensor):
        value = value.contiguous()
        digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(f"K{key!r}".encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"L{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"V{value!r}".encode())


def fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(path, framework="pt") as handle:
            digest.update(json.dumps(handle.metadata(), sort_keys=True).encode())
            _feed(digest, {key: handle.get_tensor(key) for key in handle.keys()})
    elif path.suffix == ".pt":
        import torch

        _feed(digest, torch.load(path, map_location="cpu", weights_only=True))
    else:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def write_fingerprint(workdir: Path) -> None:
    lines = []
    for path in sorted((workdir / "results").rglob("*")):
        relative = path.relative_to(workdir)
        if path.is_file() and not set(relative.parts) & set(LEFT_OUT):
            lines.append(f"{fingerprint(path)}  {relative}")
    (workdir / "fingerprint.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} files -> {workdir / 'fingerprint.txt'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path, help="an empty folder to run in (created)")
    parser.add_argument("--cores", type=int, default=2, help="Snakemake cores (default: 2)")
    parser.add_argument("--existing", action="store_true", help="fingerprint a finished run in workdir, run nothing")
    args = parser.parse_args()
    workdir = args.workdir
    if args.existing:
        write_fingerprint(workdir)
        return
    if (workdir / "results").exists():
        raise SystemExit(f"error: {workdir}/results exists; give an empty folder")
    key = workdir / "results/private/study.key"
    key.parent.mkdir(parents=True)
    os.chmod(key.parent, 0o700)
    key.write_text(FIXED_TEST_KEY)
    os.chmod(key, 0o600)
    (workdir / "config.yaml").write_text(yaml.safe_dump(TINY))
    run = subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--cores", str(args.cores)],
                         capture_output=True, text=True, env=snakemake_env())
    if run.returncode:
        raise SystemExit(f"error: the tiny run failed:\n{run.stderr[-3000:]}")
    write_fingerprint(workdir)


if __name__ == "__main__":
    main()
