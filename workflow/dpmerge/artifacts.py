"""Every file format dpmerge reads and writes: prepared tasks, task vectors, heads, pretrained tops, merged models.

Prepared tasks (`dpmerge prepare`) are torch files of cached trunk features, labels and the task's metadata:
`save_prepared` defines the format, `load_prepared` reads it memory-mapped. Tensors are safetensors.

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

from dpmerge.runtime import release_freed_memory

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
    "steps_by_queries",
    "accountant",
    "sampling",
    "neighbouring",
    "randomness",
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


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class LazySafetensors:
    """A safetensors file read one tensor at a time with plain reads.

    Unlike safe_open (which memory-maps the file, so every tensor ever touched stays in the process's resident
    set until the file is closed), only the tensors currently referenced occupy memory.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no such safetensors file: {self.path}")
        with open(self.path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            try:
                header = json.loads(handle.read(size))
            except (ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"{self.path} is not a safetensors file ({error})") from None
        self._data_start = 8 + size
        self.metadata = {key: json.loads(value) for key, value in (header.pop("__metadata__", None) or {}).items()}
        self._entries = header

    def keys(self) -> list[str]:
        return sorted(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entries[key]["shape"])

    def dtype(self, key: str) -> torch.dtype:
        return _DTYPES[self._entries[key]["dtype"]]

    def structure(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype name), as merging.check_same_structure compares them."""
        return {key: (self.shape(key), str(self.dtype(key))) for key in self.keys()}

    def get_tensor(self, key: str) -> torch.Tensor:
        begin, end = self._entries[key]["data_offsets"]
        buffer = bytearray(end - begin)
        with open(self.path, "rb") as handle:
            handle.seek(self._data_start + begin)
            handle.readinto(buffer)
        if not buffer:
            return torch.empty(self.shape(key), dtype=self.dtype(key))
        return torch.frombuffer(buffer, dtype=self.dtype(key)).reshape(self.shape(key))


def write_tensors_streaming(path: str | Path, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                            tensors, metadata: dict | None = None) -> None:
    """Write a safetensors file from an iterator of (name, tensor) in `layout` order, holding one at a time.

    `layout` (name -> (dtype, shape)) fixes the header up front; each produced tensor must match it. Written
    atomically: a failure midway leaves no file.
    """
    names = list(layout)
    header, offset = {}, 0
    for name in names:
        dtype, shape = layout[name]
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = {key: json.dumps(value) for key, value in metadata.items()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)

    def write(tmp):
        with open(tmp, "wb") as handle:
            handle.write(len(encoded).to_bytes(8, "little"))
            handle.write(encoded)
            produced = iter(tensors)
            for name in names:
                key, value = next(produced)
                if key != name or value.dtype != layout[name][0] or tuple(value.shape) != tuple(layout[name][1]):
                    raise ValueError(f"expected tensor {name!r} {layout[name]}, got {key!r} "
                                     f"({value.dtype}, {tuple(value.shape)})")
                value = value.detach().contiguous().cpu()
                if value.numel():
                    handle.write(value.reshape(-1).view(torch.uint8).numpy())
                del key, value
                release_freed_memory()  # the tensor's temporaries are gone; don't let the heap keep them

    atomic_write(path, write)


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
    lazy = LazySafetensors(path)
    for key in lazy.keys():
        _update_digest(digest, key, lazy.get_tensor(key))
    return digest.hexdigest()


def save_prepared(path: str | Path, *, task: str, backbone: str, task_spec: dict, class_names, train_features,
                  train_labels, test_features, test_labels, pretrained_sha256: str) -> None:
    """Write a prepared task file (`dpmerge prepare`; read back by `load_prepared`).

    Fields: task and backbone names, task_spec (the task's TaskSpec as a dict), class_names, train_features and
    test_features (lists of tensors: the frozen trunk's outputs, one entry per trunk output), train_labels and
    test_labels, and pretrained_sha256 (the checkpoint the features came from, so a later stage can refuse
    features of other weights).
    """
    payload = {
        "task": task,
        "backbone": backbone,
        "task_spec": task_spec,
        "class_names": list(class_names),
        "train_features": list(train_features),
        # int64 class indices, or float32 scores for a regression task (STS-B)
        "train_labels": torch.as_tensor(train_labels),
        "test_features": list(test_features),
        "test_labels": torch.as_tensor(test_labels),
        "pretrained_sha256": pretrained_sha256,
    }
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def load_prepared(path: str | Path) -> dict:
    """Read a prepared task file written by `dpmerge prepare`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prepared task file not found: {path} (run the 'prepare' rule first)")
    # Memory-mapped: a fine-tune reads only its Poisson batches' rows, so a prepared task of many GB (a paper
    # dataset's images at 224 px) costs page cache, not RAM.
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
