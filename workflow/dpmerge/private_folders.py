"""The folders of a study's results that hold private data or side channels, kept readable by their owner alone.

The results folder is what users copy and share, and its releases follow the umask so collaborators can read
them. These folders must not, whatever the umask:

- `private/`: the study key and the kept audit runs (their secret coins);
- `data/`: the prepared tasks, the private training features;
- `checkpoints/`: the fine-tunes' states, generators included;
- `logs/`: non-private losses and accuracies, real Poisson batch sizes;
- `benchmarks/`: every job's wall time and memory (an audit's or a private job's time is a side channel).

Snakemake and the shell create what lies in them (log redirections, benchmark files, output folders) with the
umask's modes, so the Snakefile makes each folder 0700 before any job runs (`close`): nothing inside is then
reachable by others. `close` also sets every folder under them to 0700 and every file to 0600 (`sweep`), what
an older or interrupted run left, and the Snakefile calls it again when the run ends, so a copy that keeps
modes (`cp -a`, rsync -a) keeps them private too.
Standard library only: the Snakefile imports it while it is parsed.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

PRIVATE_FOLDERS = ("private", "data", "checkpoints", "logs", "benchmarks")
FOLDER_MODE, FILE_MODE = 0o700, 0o600


def private_folders(results: str | Path) -> list[Path]:
    return [Path(results) / name for name in PRIVATE_FOLDERS]


class ExposedKeyError(Exception):
    pass


def check_key(results: str | Path) -> None:
    """Refuse a study key that others may read (its mode gives group or others any access), before anything
    tightens modes: a key others could read may already be copied, and then no release made with it is protected.
    Making it private again is the user's decision, which the message explains; dpmerge never does it silently."""
    key = Path(results) / "private" / "study.key"
    try:
        mode = stat.S_IMODE(os.stat(key).st_mode)
    except FileNotFoundError:
        return
    if mode & 0o077:
        raise ExposedKeyError(
            f"{key} is readable by others (mode {mode:04o}): anyone who read it can replay this study's releases "
            "and tell which examples trained them. dpmerge does not repair this silently. If nobody else could "
            f"have read it, make it private yourself (chmod 700 {key.parent} && chmod 600 {key}) and run again. If "
            "someone may have copied it, the releases made with it are not protected: start a new study in a new "
            "results folder (a new key), and treat what this one released as unprotected.")


def close(results: str | Path) -> None:
    """Create each private folder of `results` with mode 0700, or set an existing one to it, then `sweep` them;
    what could not be made private is named in a warning on stderr."""
    for folder in private_folders(results):
        folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)  # the parents keep the umask's modes
        os.chmod(folder, FOLDER_MODE)  # mkdir's mode is masked by the umask, and an existing folder keeps its own
    left = sweep(results)
    if left:
        print(f"dpmerge: warning: {len(left)} entries in the private folders of {results} could not be made "
              f"private (0700 folders, 0600 files), e.g. {left[0]}", file=sys.stderr, flush=True)


def close_snakemake_folder(folder: str | Path = ".snakemake") -> None:
    """Snakemake's own folder in the working directory: per output its job's start and end times (wall times of
    private jobs, a side channel) and the console logs. It is made 0700 (its files keep their modes, unreachable
    through the folder); its contents are Snakemake's, so nothing inside is changed."""
    if Path(folder).is_dir():
        os.chmod(folder, FOLDER_MODE)


def sweep(results: str | Path) -> list[str]:
    """Every folder under the private folders 0700, every file 0600. Symbolic links inside are neither changed
    nor followed (a private folder that is itself a link, e.g. data/ on a larger disk, is walked: `close` has
    made its target 0700). Returns what could not be changed (e.g. another user's file), each with the reason."""
    failed: list[str] = []
    for folder in private_folders(results):
        if folder.is_dir():
            for root, _, files in os.walk(folder, onerror=lambda error: failed.append(str(error))):
                _set_mode(root, FOLDER_MODE, failed)
                for name in files:
                    _set_mode(os.path.join(root, name), FILE_MODE, failed)
    return failed


def _set_mode(path: str, wanted: int, failed: list[str]) -> None:
    try:
        status = os.lstat(path)
        if not stat.S_ISLNK(status.st_mode) and stat.S_IMODE(status.st_mode) != wanted:
            os.chmod(path, wanted)
    except OSError as error:
        failed.append(f"{path}: {error.strerror or error}")
