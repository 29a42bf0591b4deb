"""The warm fork server runs a command exactly as a fresh process would, and dies with its job."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from dpmerge import forkserver
from dpmerge.artifacts import PRIVACY_FIELDS, load_tensors, save_released, save_tensors, tensors_sha256
from dpmerge.cli import main


def wait_until(condition, seconds=90.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def listening(address):
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(address))
        return True
    except OSError:
        return False
    finally:
        probe.close()


@pytest.fixture
def server(tmp_path):
    directory = tmp_path / "sockets"
    directory.mkdir(mode=0o700)
    address = directory / "test.sock"
    process = subprocess.Popen([sys.executable, "-m", "dpmerge.forkserver", str(address), "30"])
    assert wait_until(lambda: listening(address)), "fork server did not start"
    yield address, process
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def vectors(tmp_path):
    base = {"w": torch.ones(64, 64)}
    save_tensors(tmp_path / "w0.safetensors", base, {"pretrained_sha256": "abc"})
    record = {field: 0 for field in PRIVACY_FIELDS}
    record.update(method="naive_dp", target_epsilon=4.0, spent_epsilon=3.9, delta=1e-3, seed=0,
                  pretrained_sha256="abc", accountant="rdp", sampling="poisson", w0_sha256=tensors_sha256(base))
    paths = []
    for index in range(2):
        path = tmp_path / f"tv{index}.safetensors"
        save_released(path, {"w": torch.linspace(-1, 1, 64 * 64).view(64, 64) * (index + 1)}, record,
                      {"backbone": "toy", "task": f"task{index}"})
        paths.append(str(path))
    return tmp_path, paths


def merge_argv(folder, paths, out, *extra):
    return ["merge", "--method", "ties", "--base", str(folder / "w0.safetensors"), *extra, "-o", str(out), *paths]


def client(address, argv, **kwargs):
    code = f"import sys; from dpmerge import forkserver; sys.exit(forkserver.call({argv!r}, {str(address)!r}, False))"
    return subprocess.Popen([sys.executable, "-c", code], **kwargs)


@pytest.mark.slow
def test_a_command_through_the_server_writes_what_it_writes_in_process(server, vectors):
    address, _ = server
    folder, paths = vectors
    main(merge_argv(folder, paths, folder / "here.safetensors"))
    assert forkserver.call(merge_argv(folder, paths, folder / "served.safetensors"), address, start=False) == 0
    here, here_meta = load_tensors(folder / "here.safetensors")
    served, served_meta = load_tensors(folder / "served.safetensors")
    assert here_meta == served_meta and torch.equal(here["w"], served["w"])


@pytest.mark.slow
def test_errors_reach_the_callers_stderr_with_the_exit_code(server, vectors, capsys):
    address, _ = server
    folder, paths = vectors
    argv = merge_argv(folder, paths, folder / "x.safetensors", "--param", "density=2")
    with pytest.raises(SystemExit) as here:
        main(argv)
    expected = str(here.value.code)
    result = client(address, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = result.communicate(timeout=60)
    assert result.returncode == 1 and err.strip() == expected.strip(), err
    assert not (folder / "x.safetensors").exists()


def children_of(process):
    return psutil.Process(process.pid).children()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_killing_the_job_kills_its_forked_command(server, vectors, how):
    address, process = server
    folder, paths = vectors
    # WUDI's Adam loop on a weight matrix for a million iterations: a command that runs until it is killed
    argv = ["merge", "--method", "wudi", "--param", "iterations=1000000", "--base", str(folder / "w0.safetensors"),
            "-o", str(folder / "never.safetensors"), *paths]
    job = client(address, argv, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: len(children_of(process)) == 1, 60)
    job.send_signal(getattr(signal, how))
    job.wait(timeout=30)
    assert wait_until(lambda: not children_of(process), 30), "the forked command outlived its job"
    if how == "SIGTERM":
        assert job.returncode == 128 + signal.SIGTERM  # the child's death by SIGTERM, as a shell reports it
    assert not (folder / "never.safetensors").exists()


def held_server(tmp_path, start_command: bool):
    """A stand-in server that reads a client's request, then waits until the test has sent the client a signal
    before it answers: with the PID of a `sleep 60` it starts (start_command) or by closing the connection."""
    directory = tmp_path / "sockets"
    directory.mkdir(mode=0o700)
    address = directory / "held.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(address))
    listener.listen(1)
    request_read, signalled, command = threading.Event(), threading.Event(), []

    def serve():
        connection, _ = listener.accept()
        with connection:
            _, fds = forkserver._read_request(connection)
            for fd in fds:
                os.close(fd)
            request_read.set()
            signalled.wait(30)
            time.sleep(0.5)  # the client's handler runs while it still waits for the PID
            if not start_command:
                return
            command.append(subprocess.Popen(["sleep", "60"]))
            try:
                connection.sendall(forkserver._PID.pack(command[0].pid))
                returncode = command[0].wait(timeout=10)
                connection.sendall(forkserver._STATUS.pack(returncode))
            except (OSError, subprocess.TimeoutExpired):  # the client is gone: the code before this test's fix
                command[0].kill()
                command[0].wait()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    job = client(address, ["--help"], stderr=subprocess.DEVNULL)
    try:
        assert request_read.wait(60), "the client never sent its request"
        job.send_signal(signal.SIGTERM)
        signalled.set()
        job.wait(timeout=30)
        thread.join(timeout=30)
    finally:
        job.kill()
        listener.close()
    return job, command


@pytest.mark.slow
def test_a_signal_before_the_command_pid_reaches_the_client_still_reaches_the_command(tmp_path):
    """The real server forks the command before the client hears its PID; a job killed in that window (Snakemake
    or Slurm is free to) must end as the command's death, not as the client's. The stand-in server holds the PID
    back until the client has been sent SIGTERM, so the window is certain, not a race under load."""
    job, command = held_server(tmp_path, start_command=True)
    assert command and command[0].returncode == -signal.SIGTERM, "the signal never reached the command"
    assert job.returncode == 128 + signal.SIGTERM


@pytest.mark.slow
def test_a_signal_before_a_server_that_then_fails_kills_the_client_rather_than_running_the_command(tmp_path):
    # `dpmerge` runs a command in its own process when the server is unavailable; a job told to stop must not
    job, command = held_server(tmp_path, start_command=False)
    assert not command and job.returncode == -signal.SIGTERM


def test_the_address_follows_the_environment_but_not_the_shell_state():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert forkserver.server_address(base) == forkserver.server_address({**base, "PWD": "/elsewhere", "SHLVL": "3"})
    assert forkserver.server_address(base) != forkserver.server_address({**base, "OMP_NUM_THREADS": "2"})
    # CPU and GPU jobs share a server; a job's own device does not (dpmerge/gpu_slots.py)
    assert forkserver.server_address(base) == forkserver.server_address({**base, "DPMERGE_GPU_JOB": "0"})
    assert forkserver.server_address(base) != forkserver.server_address({**base, "CUDA_VISIBLE_DEVICES": "1"})
    assert forkserver.server_address(base).parent.stat().st_mode & 0o077 == 0 or \
        not forkserver.server_address(base).parent.exists()


def test_without_a_server_the_caller_is_told_to_run_the_command_itself(tmp_path):
    directory = tmp_path / "none"
    directory.mkdir(mode=0o700)
    with pytest.raises(forkserver.Unavailable):
        forkserver.call(["--help"], directory / "absent.sock", start=False)


def test_the_launcher_runs_in_process_when_the_server_is_off(tmp_path):
    env = {**os.environ, "DPMERGE_FORKSERVER": "0"}
    result = subprocess.run([sys.executable, "-m", "dpmerge.launch", "--help"], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0 and "usage: dpmerge" in result.stdout
