"""Every file format dpmerge reads and writes: prepared tasks, task vectors, heads, pretrained tops, merged models.

Prepared tasks (`dpmerge prepare`) are torch files of cached trunk features, labels and the task's metadata:
`save_prepared` defines the format, `load_prepared` reads it memory-mapped. Tensors are safetensors, read
through the safetensors library, which checks every header; a bad file is a SafetensorsFileError (a
ValueError) naming the file and what is wrong. The streamed merge writer is our own, to hold one tensor at a
time, and has the library check what it wrote before the file is renamed into place.

Files are written atomically (temporary file in the same folder, then rename), so a killed job never leaves
a truncated file behind. Metadata is a flat str -> str mapping (the safetensors format); we store every field
as JSON so numbers keep their types when read back.

A released task vector must carry its full privacy record (`PRIVACY_FIELDS`): `save_released` refuses to
write one without it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
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
# Every release's metadata carries the tensors_sha256 of its own tensors (privacy/release_log.py writes it)
RELEASE_HASH = "tensors_sha256"
# A release that is a function of another release alone (a denoised task vector, stages/denoise.py) says so here:
# {"operation", "method", "tensors_sha256" of the release}; the ledger finds that release and charges nothing.
POST_PROCESSING = "post_processing_of"


def current_umask() -> int:
    try:  # Linux states it without changing it (os.umask can only read by setting, process-wide)
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    current = os.umask(0o077)
    os.umask(current)
    return current


def check_output_path(path: str | Path) -> Path:
    """`path` as a file to write: refused, naming it, where a folder stands (a file is never written over a
    folder) or where a file stands in place of a folder above it."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the output a file name (e.g. {path / 'merged.safetensors'})")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{path}: {parent} is a file, not a folder")
    return path


def atomic_write(path: str | Path, write, *, private: bool = False) -> None:
    """Call write(tmp_path) then rename the temporary file onto `path`.

    The file gets the mode a plain `open` would give it (0666 less the umask), so collaborators the umask
    admits can read results; mkstemp's 0600 is kept only for `private` files (checkpoints: they hold the
    generators' states; prepared tasks: the training features; kept audit runs: their secret coins), whose
    folder, when this makes it, is 0700."""
    path = check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True, **({"mode": 0o700} if private else {}))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        if not private:
            os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as error:
        written = Path(tmp).stat().st_size if Path(tmp).exists() else 0
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, Exception) and _disk_full(error, path.parent):
            free = shutil.disk_usage(path.parent).free
            raise ValueError(f"{path}: no space left on the device that holds {path.parent} ({_size(free)} free "
                             f"after this file's {_size(written)} were removed; it needs more than that): free space "
                             "there or move the results folder (config `results:`); nothing already written was "
                             "changed") from None
        raise


# torch and safetensors report a full disk in their own words ("file write failed", "unexpected pos"); what
# they failed on is told by the free space left where the file was going
_FULL_DISK_SLACK = 16 * 2**20


def _disk_full(error: Exception, folder: Path) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(folder).free < _FULL_DISK_SLACK
    except OSError:
        return False


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Write tensors and metadata atomically. A `RELEASE_HASH` in the metadata is always this file's own (a record
    copied from another release, e.g. by a denoised or mixed release, names its parent's tensors)."""
    contiguous = {key: value.detach().contiguous().cpu() for key, value in tensors.items()}
    metadata = dict(metadata or {})
    if RELEASE_HASH in metadata:
        metadata[RELEASE_HASH] = tensors_sha256(contiguous)
    encoded = {key: json.dumps(value, sort_keys=True) for key, value in metadata.items()}

    def write(tmp):
        save_file(contiguous, tmp, metadata=encoded)
        canonical_metadata_order(tmp)

    atomic_write(path, write)


def canonical_metadata_order(path: str | Path) -> None:
    """Rewrite a safetensors header in place with its metadata keys sorted, so that the same tensors and record
    make the same bytes in every process. The library serialises metadata from a hash map whose order changes
    with each process's hash seed; the keys are only reordered (the header keeps its length, spaces pad what
    escaping may save), and the library reads the file back before it is renamed into place."""
    with open(path, "r+b") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
        metadata = header.pop("__metadata__", None)
        ordered = {"__metadata__": dict(sorted(metadata.items()))} if metadata is not None else {}
        ordered.update(header)  # the tensors in the library's order (dtype alignment, then name): already fixed
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:
            raise ValueError(f"{path}: the sorted header is longer than the library's ({len(text)} > {length})")
        handle.seek(8)
        handle.write(text + b" " * (length - len(text)))
    _open(path)


class SafetensorsFileError(ValueError):
    """A file that is not a valid safetensors file, or not one dpmerge can read; the message names the file and
    what is wrong. A ValueError, so the command line reports it as `error: ...` (cli.py)."""


# The library's messages all start with this; the file's name is more use to a reader in its place.
_LIBRARY_PREFIX = "Error while deserializing header: "


def _library_error(path: Path, error: Exception, doing: str = "") -> SafetensorsFileError:
    reason = str(error).removeprefix(_LIBRARY_PREFIX)
    return SafetensorsFileError(f"{path}: not a valid safetensors file{doing} ({reason})")


def _open(path: str | Path):
    """The safetensors library's reader of `path`, which has checked the header: its declared size (at most
    100 MB), JSON, every dtype and shape, and offsets that are contiguous, in range and cover the file exactly.

    The `pread` backend reads each tensor into memory of its own when asked, and refuses a short read. The
    default memory map would keep every tensor ever read resident until the file is closed: a streamed merge
    of 8 ViT-B/32 vectors would then hold 8 models instead of one tensor per task (docs/performance.md, "Merging").
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such safetensors file: {path}")
    try:
        return safe_open(str(path), framework="pt", backend="pread")
    except (SafetensorError, OSError) as error:
        raise _library_error(path, error) from None


def _decode_metadata(path: Path, raw: dict | None) -> dict:
    """A file's metadata: dpmerge stores every field as JSON, so in a file it wrote (one with an `artifact` or a
    privacy field) a field that is not JSON is refused, naming it; a file from elsewhere keeps such fields as the
    text they are (`save_pretrained` writes {"format": "pt"})."""
    decoded, text = {}, []
    for key, value in (raw or {}).items():
        try:
            decoded[key] = json.loads(value)
        except ValueError:
            decoded[key] = value
            text.append(key)
    if text and ("artifact" in decoded or any(field in decoded for field in PRIVACY_FIELDS)):
        raise SafetensorsFileError(f"{path}: metadata field {text[0]!r} is not JSON (dpmerge stores every field as "
                                   f"JSON): {raw[text[0]][:80]!r}")
    return decoded


def _read(handle, path: Path, key: str) -> torch.Tensor:
    try:
        return handle.get_tensor(key)
    except (SafetensorError, OSError) as error:  # a short read: the file changed since it was opened
        raise _library_error(path, error, f" while reading tensor {key!r}") from None


def read_metadata(path: str | Path) -> dict:
    path = Path(path)
    return _decode_metadata(path, _open(path).metadata())


def load_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """A file's tensors and metadata; a release's tensors checked against the SHA-256 its record carries."""
    path = Path(path)
    handle = _open(path)
    metadata = _decode_metadata(path, handle.metadata())
    tensors = {key: _read(handle, path, key) for key in handle.keys()}
    check_release_content(path, metadata, tensors_sha256(tensors))
    return tensors, metadata


def check_release_content(path: str | Path, metadata: dict, digest: str) -> None:
    """Refuse a release whose tensors (`digest`, tensors_sha256) are not those it was released with: a flipped
    byte or an edit after release would otherwise flow silently into every merge, score and figure."""
    recorded = metadata.get(RELEASE_HASH)
    if recorded is not None and recorded != digest:
        raise SafetensorsFileError(f"{path}: its tensors do not match the SHA-256 its record carries "
                                   f"({str(recorded)[:12]}...): corrupted or edited after release; restore it from a "
                                   "backup, or delete it and rerun (the ledger keeps counting the first release)")


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class SafetensorsFile:
    """A safetensors file read one tensor at a time through the safetensors library (`_open`): the header is
    checked when the file is opened, every read is complete, and only the tensors still referenced occupy
    memory. Errors name the file (SafetensorsFileError)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._handle = _open(self.path)
        self.metadata = _decode_metadata(self.path, self._handle.metadata())
        self._entries = {}
        for key in sorted(self._handle.keys()):
            view = self._handle.get_slice(key)  # the header's entry; reads no data
            name = view.get_dtype()
            if name not in _DTYPES:
                raise SafetensorsFileError(f"{self.path}: tensor {key!r} has dtype {name}, which dpmerge does not "
                                           f"read (expected one of {', '.join(_DTYPES)})")
            self._entries[key] = (_DTYPES[name], tuple(view.get_shape()))

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key][1]

    def dtype(self, key: str) -> torch.dtype:
        return self._entries[key][0]

    def structure(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype name), as merging.check_same_structure compares them."""
        return {key: (self.shape(key), str(self.dtype(key))) for key in self.keys()}

    def get_tensor(self, key: str) -> torch.Tensor:
        return _read(self._handle, self.path, key)


def write_tensors_streaming(path: str | Path, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                            tensors, metadata: dict | None = None, *, encoded: bool = False) -> None:
    """Write a safetensors file from an iterator of (name, tensor) in `layout` order, holding one at a time.

    `layout` (name -> (dtype, shape)) fixes the header up front; each produced tensor must match it. Metadata
    values are stored as JSON, or as the strings they are when `encoded` (another tool's fields, e.g.
    save_pretrained's {"format": "pt"}). Written atomically: a failure midway leaves no file.
    """
    names = list(layout)
    header, offset = {}, 0
    for name in names:
        dtype, shape = layout[name]
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    own_hash = bool(metadata) and RELEASE_HASH in metadata and not encoded
    if metadata:
        # a record copied from a release names that release's tensors, not these (save_tensors): this file's own
        # hash is written once its tensors are, over a placeholder of the same length in the header
        header["__metadata__"] = {key: json.dumps(_PENDING_HASH) if key == RELEASE_HASH else
                                  value if encoded else json.dumps(value, sort_keys=True)
                                  for key, value in sorted(metadata.items()) if key != RELEASE_HASH or own_hash}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)

    def write(tmp):
        with open(tmp, "wb") as handle:
            handle.write(len(encoded).to_bytes(8, "little"))
            handle.write(encoded)
            produced = iter(tensors)
            for name in names:
                key, value = next(produced, (None, None))
                if key is None:
                    raise ValueError(f"{path}: the merge produced no tensor {name!r} (expected {len(names)} tensors)")
                if key != name or value.dtype != layout[name][0] or tuple(value.shape) != tuple(layout[name][1]):
                    raise ValueError(f"expected tensor {name!r} {layout[name]}, got {key!r} "
                                     f"({value.dtype}, {tuple(value.shape)})")
                value = value.detach().contiguous().cpu()
                if value.numel():
                    handle.write(value.reshape(-1).view(torch.uint8).numpy())
                del key, value
                release_freed_memory()  # the tensor's temporaries are gone; don't let the heap keep them
            if next(produced, None) is not None:
                raise ValueError(f"{path}: the merge produced more tensors than the {len(names)} of its layout")
        # This writer is ours (the library's needs every tensor in memory at once), so the library checks its
        # header and coverage before the file is renamed into place: what it writes, the library reads.
        written = _open(tmp)
        if sorted(written.keys()) != sorted(names):
            raise ValueError(f"{path}: the written header lists other tensors than the layout")
        if own_hash:
            _write_own_hash(tmp, tensors_sha256_of(SafetensorsFile(tmp)))

    atomic_write(path, write)


_PENDING_HASH = "?" * 64  # as long as a SHA-256 in hex, so the header keeps its length when the hash replaces it


def _write_own_hash(path: str | Path, digest: str) -> None:
    """Replace the header's placeholder with the file's own tensors_sha256 (a second read of what was written)."""
    with open(path, "r+b") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = handle.read(length)
        if header.count(_PENDING_HASH.encode()) != 1:
            raise ValueError(f"{path}: the header's place for its own hash is not there once")
        handle.seek(8)
        handle.write(header.replace(_PENDING_HASH.encode(), digest.encode()))


def missing_privacy_fields(record: dict) -> list[str]:
    return [field for field in PRIVACY_FIELDS if field not in record]


def check_privacy_record(record: dict, where: str) -> None:
    missing = missing_privacy_fields(record)
    if missing:
        raise ValueError(f"{where}: privacy record lacks {', '.join(missing)}; refusing to release")


def save_released(path: str | Path, tensors: dict[str, torch.Tensor], record: dict, extra: dict | None = None) -> None:
    """Write a released artefact (task vector or head) only together with its privacy record and the SHA-256 of
    its tensors (`RELEASE_HASH`), which every reader checks (`load_tensors`)."""
    check_privacy_record(record, str(path))
    save_tensors(path, tensors, {**record, **(extra or {}), RELEASE_HASH: ""})


def _update_digest(digest, key: str, value: torch.Tensor) -> None:
    value = value.detach().contiguous().cpu()
    digest.update(f"{key}|{value.dtype}|{tuple(value.shape)}|".encode())
    digest.update(value.view(torch.uint8).numpy() if value.numel() else b"")  # the buffer itself, no copy


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """Order-independent content hash of a tensor mapping (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        _update_digest(digest, key, tensors[key])
    return digest.hexdigest()


def all_finite(value: torch.Tensor) -> bool:
    # A NaN or Inf anywhere makes the sum of squares NaN or Inf, so a finite one clears the tensor in one BLAS
    # pass (a quarter of isfinite().all()'s time, which was a sixth of Iso-C's merge); only where it is not finite (a
    # NaN, an Inf, or squares that overflow) does each entry need looking at.
    if value.dtype in (torch.float32, torch.float64):
        flat = value.reshape(-1)
        if bool(torch.isfinite(torch.dot(flat, flat))):
            return True
    return bool(torch.isfinite(value).all())


def file_tensors_sha256(path: str | Path, *, finite: bool = False) -> str:
    """tensors_sha256 of a safetensors file's tensors, read one tensor at a time (for streaming merges)."""
    return tensors_sha256_of(SafetensorsFile(path), finite=finite)


def tensors_sha256_of(file, keys=None, *, finite: bool = False) -> str:
    """tensors_sha256 of the tensors `keys` (default: all) of an opened file or checkpoint (anything with keys()
    and get_tensor(), e.g. checkpoints.ShardedCheckpoint), read one tensor at a time: the same hash whether the
    tensors sit in one file or in shards.

    With `finite`, a floating-point tensor holding NaN or Inf is refused (the pass reads every byte anyway)."""
    digest = hashlib.sha256()
    for key in sorted(file.keys() if keys is None else keys):
        value = file.get_tensor(key)
        if finite and value.is_floating_point() and not all_finite(value):
            raise SafetensorsFileError(f"{file.path}: tensor {key!r} contains NaN or Inf")
        _update_digest(digest, key, value)
        del value
        release_freed_memory()  # as the writer does: a hash pass must not leave the merge a fuller heap
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
    # private: the training features of a private task (docs/privacy.md, "Threat model"; dpmerge/private_folders.py)
    atomic_write(path, lambda tmp: torch.save(payload, tmp), private=True)


def load_prepared(path: str | Path) -> dict:
    """Read a prepared task file written by `dpmerge prepare`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prepared task file not found: {path} (run the 'prepare' rule first)")
    # Memory-mapped: a fine-tune reads only its Poisson batches' rows, so a prepared task of many GB (a paper
    # dataset's images at 224 px) costs page cache, not RAM.
    expected = "a prepared task file written by 'dpmerge prepare' (a torch zip archive)"
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch says "unexpected pos", "PytorchStreamReader failed", "invalid load key"...
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path}: not {expected} ({reason}); prepare it again") from None
    # what names a prepared task; the splits a reader needs it checks itself (scoring reads no training split)
    missing = [key for key in ("task", "task_spec") if not isinstance(payload, dict) or key not in payload]
    if missing:
        raise ValueError(f"{path}: not {expected}: it lacks {', '.join(missing)}")
    return payload
