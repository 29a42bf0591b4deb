"""Private stays private: what a study keeps for itself is readable by its owner alone, and what it releases
names no folder of this machine.

Under the results folder (the folder users copy and share), the folders of private data and side channels
(the study key and kept audit runs, prepared training features, checkpoints, logs with non-private losses and
real batch sizes, benchmarks with wall times) are 0700 and every file in them 0600, whatever the umask; the
releases (task vectors, merges, tables) keep the umask's modes. Released files and the ledger record paths
relative to the results folder, never the absolute path of the run.
"""

import json
import os
import stat
import subprocess

import pandas as pd
import pytest
import yaml

from dpmerge.artifacts import read_metadata
from workflow_runs import SNAKEMAKE, snakemake_env

PRIVATE_FOLDERS = ("private", "data", "logs", "checkpoints", "benchmarks")

# One backbone, two tasks, one release group: a merge with private statistics (a statistics file, recorded in the
# merged model and the ledger), a plain one, and a white-box audit of the releases and the merge (kept runs).
STUDY = {
    "seeds": [0], "epsilons": [4], "methods": ["naive_dp"],
    "backbones": {"effnet": {"kind": "efficientnet_lite0", "trainable_blocks": 1, "image_size": 32,
                             "tasks": ["digits", "textures"], "finetune": {"lr": 0.002}}},
    "data": {"max_train": 48, "max_test": 24},
    "finetune": {"epochs": 0.4, "batch_size": 8, "lr": 0.001},
    "merge": {"weight_averaging": {},
              "fisher": {"statistics": {"data": "private", "examples": 32, "clip_norm": 0.01, "epsilon": 1.0}}},
    "tables": {"operator": "weight_averaging"},
    "diagnostics": {"seeds": 0, "interpolation": {"operator": "weight_averaging"},
                    "curvature": {"operator": "weight_averaging"}, "landscape": {"operator": "weight_averaging"}},
    "audit": {"methods": ["naive_dp"], "kinds": ["white_box"], "canaries": {"white_box": 64},
              "merge": ["weight_averaging"]},
}


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def snakemake(workdir, *args):
    """The workflow under umask 022, the usual one: files 0644 and folders 0755 unless made otherwise."""
    return subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--cores", "2", *args], capture_output=True,
                          text=True, env=snakemake_env(), preexec_fn=lambda: os.umask(0o022))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished study whose results folder is given by its absolute path (as a study on a cluster's scratch
    space gives it), so that any recorded path that is not made relative shows the run's folder."""
    workdir = tmp_path_factory.mktemp("private_study")
    config = {"results": str(workdir / "results"), **STUDY}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return workdir


def private_entries(results):
    for name in PRIVATE_FOLDERS:
        if (results / name).exists():
            yield results / name
            yield from (results / name).rglob("*")


def test_private_folders_are_0700_and_their_files_0600_whatever_the_umask(study):
    results = study / "results"
    assert (results / "private/study.key").is_file() and list((results / "private/audits").rglob("*.pt"))
    assert list((results / "data").rglob("*.pt")) and list((results / "logs").rglob("*.log"))
    assert list((results / "benchmarks").rglob("*.tsv"))
    loose = [f"{path.relative_to(results)} {mode(path):04o}" for path in private_entries(results)
             if mode(path) != (0o700 if path.is_dir() else 0o600)]
    # the checkpoints' folder too, although a finished study has none left: made private before any job
    missing = [f"{name} missing" for name in PRIVATE_FOLDERS if not (results / name).is_dir()]
    assert not loose + missing, "readable by others:\n" + "\n".join(loose + missing)


def test_releases_keep_the_umasks_modes(study):
    results = study / "results"
    assert mode(results) == 0o755 and mode(results / "taskvectors") == 0o755 and mode(results / "merged") == 0o755
    vector = results / "taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors"
    assert mode(vector) == 0o444  # 0644 from the umask, write-protected as a release (protected())
    assert mode(results / "merged/effnet/eps4/naive_dp/s0/weight_averaging.safetensors") == 0o644
    assert mode(results / "tables/table1_effnet_eps4.md") == 0o644
    assert mode(results / "privacy/ledger.md") == 0o644


def test_a_rerun_makes_private_what_an_older_run_left_readable(study):
    """A study made before these folders were private: the next run, even one with nothing to do, closes them."""
    results = study / "results"
    log = next((results / "logs").rglob("*.log"))
    for folder in (log.parent, results / "logs", results / "data"):
        folder.chmod(0o755)
    log.chmod(0o644)
    result = snakemake(study)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr
    assert (mode(results / "logs"), mode(results / "data"), mode(log.parent), mode(log)) == (0o700, 0o700, 0o700,
                                                                                               0o600)


def test_snakemakes_own_folder_with_the_jobs_times_is_0700(study):
    assert mode(study / ".snakemake") == 0o700


def test_a_key_others_could_read_is_refused_not_repaired_even_by_a_dry_run(study, tmp_path):
    results = study / "results"
    key = results / "private/study.key"
    for args in (["-n"], []):
        key.chmod(0o644)
        (results / "private").chmod(0o755)
        result = snakemake(study, *args)
        output = result.stdout + result.stderr
        assert result.returncode != 0
        assert f"{key} is readable by others (mode 0644)" in output and f"chmod 600 {key}" in output
        assert "Traceback" not in output
        assert mode(key) == 0o644  # left as found: making it private is the user's act
    key.chmod(0o600)
    result = snakemake(study)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert mode(results / "private") == 0o700


def released_files(results):
    private = {results / name for name in PRIVATE_FOLDERS}
    return [path for path in sorted(results.rglob("*"))
            if path.is_file() and not any(folder in path.parents for folder in private)]


def readable_text(path) -> str:
    """What a reader of the file sees: a safetensors file's metadata, a Parquet table's cells, else its bytes."""
    if path.suffix == ".safetensors":
        return json.dumps(read_metadata(path))
    if path.suffix == ".parquet":
        return pd.read_parquet(path).to_csv()
    return path.read_bytes().decode("latin-1")


def test_no_released_file_and_no_ledger_names_the_runs_folder(study):
    results = study / "results"
    released = released_files(results)
    kinds = {path.relative_to(results).parts[0] for path in released}
    assert {"taskvectors", "heads", "merged", "statistics", "privacy", "tables", "audits"} <= kinds
    naming = [str(path.relative_to(results)) for path in released if str(study) in readable_text(path)]
    assert not naming, "these name the run's absolute folder:\n" + "\n".join(naming)


def test_recorded_paths_are_relative_to_the_results_folder_and_name_the_files(study):
    results = study / "results"
    merged = read_metadata(results / "merged/effnet/eps4/naive_dp/s0/fisher.safetensors")
    named = [entry["path"] for entry in merged["inputs"]] + [merged["base"]["path"], merged["statistics"]["path"]]
    assert named == ["taskvectors/effnet/eps4/naive_dp/s0/digits.safetensors",
                     "taskvectors/effnet/eps4/naive_dp/s0/textures.safetensors",
                     "pretrained/effnet.safetensors", "statistics/effnet/eps4/naive_dp/s0/fisher.safetensors"]
    assert all((results / path).is_file() for path in named)
    for table in ("ledger", "merge_statistics"):
        paths = pd.read_parquet(results / f"privacy/{table}.parquet")["path"]
        assert len(paths) and all(not os.path.isabs(path) and (results / path).is_file() for path in paths)
    assert "| statistics/effnet/eps4/naive_dp/s0/fisher.safetensors | fisher | private |" in \
        (results / "privacy/ledger.md").read_text()


def test_the_sweep_follows_no_link_and_changes_no_file_outside(tmp_path):
    from dpmerge import private_folders

    shared = tmp_path / "shared.md"
    shared.write_text("a release")
    shared.chmod(0o644)
    logs = tmp_path / "results/logs"
    logs.mkdir(parents=True)
    (logs / "release.md").symlink_to(shared)
    (logs / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    (logs / "job.log").write_text("loss 0.1")
    (logs / "job.log").chmod(0o644)
    outside = mode(tmp_path)
    private_folders.close(tmp_path / "results")
    assert (mode(shared), mode(tmp_path), mode(logs / "job.log"), mode(logs)) == (0o644, outside, 0o600, 0o700)
    assert all(mode(tmp_path / "results" / name) == 0o700 for name in PRIVATE_FOLDERS)
