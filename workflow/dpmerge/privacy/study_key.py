"""The study's secret key: where every randomized mechanism's randomness comes from.

Differential privacy protects a training example only while the mechanism's randomness (which examples a
Poisson batch holds, which Gaussian noise is added) stays unknown to the adversary. A seed that a release records,
or that anyone can guess, lets an adversary who knows every example but one replay the training on both candidate
datasets and see which replay reproduces the release bit for bit: membership is then decided with certainty,
whatever epsilon says. So the randomness of every mechanism is derived from one secret key per study:

- 256 bits from the operating system's CSPRNG (`secrets`), created on first use at `<results>/private/study.key`
  (folder mode 0700, file mode 0600), written once and atomically (a parallel job that loses the race reads the
  winner's key), never a declared output, never printed, logged or copied into a release, report or log line;
- each mechanism seeds its generators from HMAC-SHA256(key, its full identity and the stream's name)
  (`derive`): two mechanisms that differ in anything (backbone, task, epsilon, method and its swept values,
  seed, hyperparameters, kind of mechanism, stream) get independent randomness, and the same identity under the
  same key gets the same randomness (so a resumed run, or a rerun of the study from its key, is bit-identical).

Releases keep `seed` only as the repetition index and say `randomness: keyed` (or `secure`); nothing in them
determines a generator's state. This module has no torch import: the Snakefile and light commands may use it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

KEY_BYTES = 32
# Bump to change every derived stream on purpose (never needed for a running study: it would not resume).
DERIVATION_CONTEXT = b"dpmerge/mechanism-randomness/v1"


def default_key_path(results: str | Path) -> Path:
    """Where a study keeps its key: inside its results folder, in a folder nothing else writes to."""
    return Path(results) / "private" / "study.key"


class StudyKeyError(ValueError):
    pass


def _parse(text: str, path: Path) -> bytes:
    value = text.strip()
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise StudyKeyError(f"{path} is not a study key: expected {2 * KEY_BYTES} hexadecimal characters "
                            "(a file written by dpmerge); restore it from your backup or delete it to start a new "
                            "study (whose releases will differ)")
    return key


def read_key(path: str | Path) -> bytes:
    """The key at `path`. Refused when others may read it: a key anyone can read protects nobody."""
    path = Path(path)
    if not path.is_file():
        raise StudyKeyError(f"no study key at {path}")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise StudyKeyError(f"{path} is readable by others (mode {mode:04o}); the study key must be private: "
                            f"chmod 600 {path}")
    return _parse(path.read_text(), path)


def load_or_create_key(path: str | Path) -> bytes:
    """The study key at `path`, created (256 bits from the OS's CSPRNG, mode 0600) when there is none yet.

    Creation is atomic and race-free: the key is written to a private temporary file and hard-linked into place,
    which fails if another process got there first; that process's key is then read instead. So parallel jobs of
    one study (local or on a shared cluster file system) always agree on one key.
    """
    path = Path(path)
    if path.is_file():
        return read_key(path)
    if not path.parent.exists():  # a folder of its own (a user's existing folder keeps its mode)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
    temporary = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES).hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another job created it first: use theirs
        except OSError:  # a file system without hard links: exclusive creation is still atomic
            try:
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                    handle.write(temporary.read_text())
            except FileExistsError:
                pass
    finally:
        temporary.unlink(missing_ok=True)
    return read_key(path)


def canonical_identity(identity: dict) -> bytes:
    """One byte string per identity: sorted keys, no whitespace. 4 and 4.0 serialise differently, so callers pass
    values as the configuration gives them (the workflow always spells them the same way)."""
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str).encode()


def derive(key: bytes, identity: dict, stream: str) -> bytes:
    """32 secret bytes for one stream of one mechanism: HMAC-SHA256(key, context | identity | stream)."""
    if len(key) != KEY_BYTES:
        raise StudyKeyError(f"a study key has {KEY_BYTES} bytes, got {len(key)}")
    message = DERIVATION_CONTEXT + b"\x00" + canonical_identity(identity) + b"\x00" + stream.encode()
    return hmac.new(key, message, hashlib.sha256).digest()


def mechanism_fingerprint(key: bytes, identity: dict) -> str:
    """A one-way tag of (key, identity) for private bookkeeping (a checkpoint must belong to the same key and
    mechanism to be resumed); never released: it would tell which releases share a study."""
    return derive(key, identity, "checkpoint-fingerprint").hex()
