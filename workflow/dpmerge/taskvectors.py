"""Safetensors I/O for task vectors, heads, pretrained tops and merged models.

Files are written atomically (temporary file in the same folder, then rename), so a killed job never leaves
a truncated file behind. Metadata is a flat str -> str mapping (the safetensors format); we store every field
as JSON so numbers keep their types when read back.

A released task vector must carry its full privacy record (`PRIVACY_FIELDS`): `save_released` refuses to
write one without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

PRIVACY_FIELDS = (
    "method",
    "target_epsilon",
    "spent_epsilon",
    "delta",
    "noise_multiplier",
    "effective_noise_multiplier",
    "sample_rate",
    "steps",
    "clip_norm",
    "queries_per_step",
    "accountant",
    "sampling",
    "seed",
    "rho",
    "anchor_lambda",
    "pretrained_sha256",
    "num_train_examples",
)


def atomic_write(path: str | Path, write) -> None:
    """Call write(tmp_path) then rename the temporary file onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    encoded = {key: json.dumps(value) for key, value in (metadata or {}).items()}
    contiguous = {key: value.detach().contiguous().cpu() for key, value in tensors.items()}
    atomic_write(path, lambda tmp: save_file(contiguous, tmp, metadata=encoded))


def read_metadata(path: str | Path) -> dict:
    with safe_open(str(path), framework="pt") as handle:
        raw = handle.metadata() or {}
    return {key: json.loads(value) for key, value in raw.items()}


def load_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such safetensors file: {path}")
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        raw = handle.metadata() or {}
    return tensors, {key: json.loads(value) for key, value in raw.items()}


def check_privacy_record(record: dict, where: str) -> None:
    missing = [field for field in PRIVACY_FIELDS if field not in record]
    if missing:
        raise ValueError(f"{where}: privacy record lacks {', '.join(missing)}; refusing to release")


def save_released(path: str | Path, tensors: dict[str, torch.Tensor], record: dict, extra: dict | None = None) -> None:
    """Write a released artefact (task vector or head) only together with its privacy record."""
    check_privacy_record(record, str(path))
    save_tensors(path, tensors, {**record, **(extra or {})})


def _update_digest(digest, key: str, value: torch.Tensor) -> None:
    value = value.detach().contiguous().cpu()
    digest.update(f"{key}|{value.dtype}|{tuple(value.shape)}|".encode())
    digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """Order-independent content hash of a tensor mapping (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        _update_digest(digest, key, tensors[key])
    return digest.hexdigest()


def file_tensors_sha256(path: str | Path) -> str:
    """tensors_sha256 of a safetensors file's tensors, read one tensor at a time (for streaming merges)."""
    digest = hashlib.sha256()
    with safe_open(str(path), framework="pt") as handle:
        for key in sorted(handle.keys()):
            _update_digest(digest, key, handle.get_tensor(key))
    return digest.hexdigest()
