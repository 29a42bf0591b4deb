"""Files and folders as people have them (issue 45's first slice): task vectors written by other tools, plain
vectors without privacy records, outputs aimed at a folder. Each gets what it asks for or one clear line naming
the file, never a traceback."""

import subprocess
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from dpmerge.artifacts import read_metadata
from dpmerge.cli import main
from workflow_runs import ROOT


@pytest.fixture
def plain(tmp_path):
    """w0 and two plain task vectors as `save_pretrained` writes tensors: metadata {"format": "pt"}, no record."""
    generator = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(4, 3, generator=generator)}, tmp_path / "w0.safetensors", metadata={"format": "pt"})
    paths = []
    for index in range(2):
        path = tmp_path / f"tv{index}.safetensors"
        save_file({"w": torch.randn(4, 3, generator=generator)}, path, metadata={"format": "pt"})
        paths.append(str(path))
    return tmp_path, paths


def test_save_pretrained_metadata_is_read_as_the_text_it_is(plain):
    folder, paths = plain
    assert read_metadata(paths[0]) == {"format": "pt"}


def test_plain_vectors_with_foreign_metadata_merge(plain):
    folder, paths = plain
    out = folder / "merged.safetensors"
    main(["merge", "--method", "weight_averaging", "--base", str(folder / "w0.safetensors"), "-o", str(out), *paths])
    assert read_metadata(out)["privacy"] == "none recorded"


def test_a_merge_aimed_at_a_folder_is_refused_before_anything_is_read(plain):
    folder, paths = plain
    (folder / "out").mkdir()
    with pytest.raises(SystemExit, match=f"{folder / 'out'} is a folder; give the output a file name"):
        main(["merge", "--method", "ties", "--base", str(folder / "w0.safetensors"), "-o", str(folder / "out"),
              *paths])


def test_drift_measures_plain_vectors(plain):
    folder, paths = plain
    out = folder / "drift.parquet"
    main(["drift", "--base", str(folder / "w0.safetensors"), "--task-vectors", *paths, "-o", str(out)])
    rows = pd.read_parquet(out)
    assert list(rows["task"]) == ["tv0", "tv1"] and (rows["drift"] > 0).all()


@pytest.mark.slow
def test_the_ledger_names_a_vector_without_a_record(plain):
    folder, paths = plain
    result = subprocess.run([sys.executable, "-m", "dpmerge.cli", "ledger", *paths, "--out", str(folder / "l.parquet"),
                             "--report", str(folder / "l.md")], capture_output=True, text=True,
                            env={"PYTHONPATH": str(ROOT / "workflow"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {paths[0]} carries no privacy record"), result.stderr
