"""Checkpoints as people have them: one safetensors file, a sharded checkpoint (its `*.safetensors.index.json`
and the shards it names), or a model folder that `save_pretrained` wrote (config.json beside the weights, one
file or shards). `open_checkpoint` reads any of them as one mapping of tensors, one tensor at a time, through the
safetensors library (artifacts.SafetensorsFile); `write_model_like` writes weights back in a base checkpoint's
layout (the same shards, the same index, the folder's other files), so `from_pretrained` loads the result.

PyTorch pickles (`pytorch_model.bin`) are refused with the way to convert them: loading a pickle runs code.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from dpmerge.artifacts import (
    SafetensorsFile,
    SafetensorsFileError,
    check_output_path,
    current_umask,
    write_tensors_streaming,
)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Weights in any format: never copied from a base folder into a merged model's folder (they would be stale)
WEIGHT_SUFFIXES = (".safetensors", ".index.json", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


class ShardedCheckpoint:
    """A sharded safetensors checkpoint: the index's `weight_map` (tensor name -> shard file beside the index),
    each shard opened through the library. Reads like one SafetensorsFile; errors name the index or the shard."""

    def __init__(self, index: str | Path):
        self.path = Path(index)
        try:
            parsed = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            raise SafetensorsFileError(f"{self.path}: not a readable checkpoint index ({error})") from None
        weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise SafetensorsFileError(f"{self.path}: a checkpoint index needs a non-empty 'weight_map' "
                                       "(tensor name -> shard file), as save_pretrained writes it")
        self.index_metadata = parsed.get("metadata") or {}
        self.shard_names = sorted(set(weight_map.values()))
        for name in self.shard_names:
            if not isinstance(name, str) or Path(name).name != name:
                raise SafetensorsFileError(f"{self.path}: shard {name!r} is not a file name beside the index")
        self.shards = {name: SafetensorsFile(self.path.parent / name) for name in self.shard_names}
        self.weight_map = dict(weight_map)
        for key, name in self.weight_map.items():
            if key not in self.shards[name].keys():
                raise SafetensorsFileError(f"{self.path}: maps tensor {key!r} to {name}, which does not hold it")
        for name, shard in self.shards.items():
            unmapped = [key for key in shard.keys() if self.weight_map.get(key) != name]
            if unmapped:
                raise SafetensorsFileError(f"{shard.path} holds tensor {unmapped[0]!r}, which {self.path.name} "
                                           f"maps {'elsewhere' if unmapped[0] in self.weight_map else 'nowhere'}")
        # save_pretrained writes the same {"format": "pt"} into every shard
        self.metadata = self.shards[self.shard_names[0]].metadata

    def keys(self) -> list[str]:
        return sorted(self.weight_map)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.shards[self.weight_map[key]].shape(key)

    def dtype(self, key: str) -> torch.dtype:
        return self.shards[self.weight_map[key]].dtype(key)

    def structure(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {key: (self.shape(key), str(self.dtype(key))) for key in self.keys()}

    def get_tensor(self, key: str) -> torch.Tensor:
        return self.shards[self.weight_map[key]].get_tensor(key)


def checkpoint_file(path: str | Path) -> Path:
    """The file that holds `path`'s weights: the path itself, or in a model folder its index or single file."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            raise FileNotFoundError(f"no such checkpoint: {path} (expected a .safetensors file, a "
                                    f"*.safetensors.index.json or a model folder)")
        if path.name in PICKLES or path.suffix in (".bin", ".pt", ".pth", ".ckpt"):
            raise SafetensorsFileError(f"{path} is a PyTorch pickle, which dpmerge does not load (loading one runs "
                                       "the code inside it): load it yourself and save it with "
                                       "save_pretrained(folder) or safetensors.torch.save_file")
        return path
    for name in (INDEX_FILE, SINGLE_FILE):
        if (path / name).is_file():
            return path / name
    found = sorted(p.name for p in path.iterdir() if p.name.endswith((".safetensors", ".safetensors.index.json")))
    if len(found) == 1:
        return path / found[0]
    pickles = [name for name in PICKLES if (path / name).is_file()]
    if pickles:
        raise SafetensorsFileError(f"{path} holds its weights as a PyTorch pickle ({pickles[0]}), which dpmerge does "
                                   "not load: load the model and save_pretrained it again (safetensors is the "
                                   "default since transformers 4.35)")
    listed = ", ".join(found) if found else "none"
    raise SafetensorsFileError(f"{path}: a model folder needs {SINGLE_FILE} or {INDEX_FILE} (safetensors files "
                               f"found: {listed})")


def open_checkpoint(path: str | Path) -> SafetensorsFile | ShardedCheckpoint:
    """Any checkpoint as one mapping of tensors (keys, shape, dtype, structure, get_tensor, metadata)."""
    file = checkpoint_file(path)
    if file.name.endswith(".index.json"):
        return ShardedCheckpoint(file)
    return SafetensorsFile(file)


def is_model_folder(path: str | Path) -> bool:
    return Path(path).is_dir()


def output_model_path(base: str | Path, out: str | Path) -> Path:
    """Where `write_model_like` will write, checked before anything is computed: a folder when the base is a
    model folder (a new one: nothing is written over an existing folder), otherwise a file (replaced
    atomically), and a file name ending in .index.json for a sharded base outside a folder is refused."""
    out = Path(out)
    if is_model_folder(base):
        if out.exists():
            raise ValueError(f"--output-model {out} exists; the base {base} is a model folder, so the merged model is "
                             "written as a new folder: give a path that does not exist yet")
        for parent in out.parents:
            if parent.exists() and not parent.is_dir():
                raise ValueError(f"--output-model {out}: {parent} is a file, not a folder")
        return out
    if checkpoint_file(base).name.endswith(".index.json"):
        raise ValueError(f"--output-model: the base {base} is a sharded checkpoint outside a model folder; give "
                         "its folder as --base so the shards and index are written into a new folder")
    return check_output_path(out)


def write_model_like(base: str | Path, weights, out: str | Path, record: dict) -> None:
    """Write `weights` (a mapping read one tensor at a time, with every tensor of `base`) as a checkpoint in the
    base's layout at `out`: a model folder gets the base folder's other files (config, tokenizer) and its shards
    and index, or its single file; a plain file stays a file. Every file carries {"format": "pt"} (what
    `from_pretrained` looks for) and the merge's `record` as JSON under "dpmerge". Atomic: a folder is built under
    a temporary name beside `out` and renamed into place."""
    base_file = checkpoint_file(base)
    base_checkpoint = open_checkpoint(base)
    metadata = {"format": "pt", "dpmerge": json.dumps(record)}
    if not is_model_folder(base):
        _write_shard(out, base_checkpoint.keys(), base_checkpoint, weights, metadata)
        return
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        shutil.copytree(Path(base), building, dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if n.endswith(WEIGHT_SUFFIXES)])
        if isinstance(base_checkpoint, ShardedCheckpoint):
            for name in base_checkpoint.shard_names:
                keys = [key for key in base_checkpoint.keys() if base_checkpoint.weight_map[key] == name]
                _write_shard(building / name, keys, base_checkpoint, weights, metadata)
            shutil.copyfile(base_file, building / base_file.name)  # same names in the same shards
        else:
            _write_shard(building / base_file.name, base_checkpoint.keys(), base_checkpoint, weights, metadata)
        os.chmod(building, 0o777 & ~current_umask())
        os.replace(building, out)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _write_shard(path, keys, base_checkpoint, weights, metadata: dict[str, str]) -> None:
    layout = {key: (base_checkpoint.dtype(key), base_checkpoint.shape(key)) for key in keys}
    write_tensors_streaming(path, layout, ((key, weights.get_tensor(key)) for key in keys), metadata, encoded=True)
