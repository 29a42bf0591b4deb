"""A real single-node Slurm cluster on 127.0.0.1 for the tests: Debian's Slurm packages (slurm-wlm's slurmctld,
slurmd and client) and munge, started as root and stopped by PID.

The settings are the ones measured to work in a container: Linux process tracking and no task plugin (no cgroups),
no accounting database (so Snakemake's plugin must poll with `squeue`), and ended jobs kept visible for an hour.
The config must sit at /etc/slurm/slurm.conf: with only SLURM_CONF set, the `srun` inside a batch job fails
("DNS SRV lookup failed"). A slurm.conf this module did not write is never touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

SLURM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# written by dpmerge's tests (tests/slurm_node.py); safe to delete"
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
PROGRAMS = ["slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "munged", "munge"]


# `DPMERGE_TEST_SLURM=0 make test`: a workstation run as root keeps its packages and daemons (CI, as root, leaves
# it unset and gets the real cluster).
OPT_OUT = "DPMERGE_TEST_SLURM"


class Unavailable(Exception):
    """This machine cannot host the test cluster; the message says why."""


def opted_out(environ=os.environ) -> str | None:
    """Why the real-Slurm test is turned off by OPT_OUT, or None where it runs (unset, the default, or 1).
    ValueError names the variable for a value that is neither."""
    value = environ.get(OPT_OUT, "")
    if value.strip().lower() in ("", "1", "true", "yes", "on"):
        return None
    if value.strip().lower() in ("0", "false", "no", "off"):
        return (f"{OPT_OUT}={value} turns the real-Slurm test off (unset it, or set 1, to install Slurm with "
                "apt-get and start its daemons, as root)")
    raise ValueError(f"{OPT_OUT}={value!r}: expected 0 (skip the real-Slurm test) or 1 (run it; the default)")


def _program(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None)


def _run(*args, check=True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({result.returncode}):\n{result.stdout[-2000:]}"
                           f"\n{result.stderr[-2000:]}")
    return result


def install() -> None:
    """Install Slurm and munge with apt when they are missing; Unavailable where that cannot be done here."""
    if all(_program(name) for name in PROGRAMS):
        return
    if shutil.which("apt-get") is None:
        raise Unavailable("Slurm is not installed and apt-get is unavailable on this machine, so Debian's "
                          f"slurm-wlm packages ({', '.join(PACKAGES)}) cannot be installed")
    if os.geteuid() != 0:
        raise Unavailable("Slurm is not installed, and installing it with apt-get and running its daemons needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    if _run(*command, check=False, env=env).returncode != 0:
        _run("apt-get", "update", env=env)  # a fresh machine may have no package lists yet
        _run(*command, env=env)
    missing = [name for name in PROGRAMS if not _program(name)]
    if missing:
        raise RuntimeError(f"apt-get installed {PACKAGES} but these programs are still missing: {missing}")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(predicate, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    detail = f"\n{log}:\n{log.read_text()[-3000:]}" if log is not None and log.exists() else ""
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")


def _node_hardware() -> str:
    """This machine's CPU layout as slurmd sees it, and a little less memory than it has (so the node is never
    drained for 'low RealMemory')."""
    line = _run(_program("slurmd"), "-C").stdout.splitlines()[0]
    fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
    memory = int(int(fields["RealMemory"]) * 0.9)
    layout = " ".join(f"{key}={fields[key]}" for key in
                      ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore") if key in fields)
    return f"{layout} RealMemory={memory}"


class SlurmNode:
    """Start with `SlurmNode(state_dir).start()`; `stop()` cancels what is left, stops every daemon it started and
    removes its slurm.conf."""

    def __init__(self, state_dir: Path):
        self.state = Path(state_dir)
        self.started: list[tuple[str, Path]] = []  # (daemon, its PID file), in start order

    def config_text(self) -> str:
        s = self.state
        return "\n".join([
            MARKER,
            "ClusterName=dpmerge-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MinJobAge=3600",  # ended jobs stay in squeue: the plugin polls with it, the tests count them
            "ReturnToService=2",
            f"StateSaveLocation={s}/state",
            f"SlurmdSpoolDir={s}/spool",
            f"SlurmctldPidFile={s}/slurmctld.pid",
            f"SlurmdPidFile={s}/slurmd.pid",
            f"SlurmctldLogFile={s}/slurmctld.log",
            f"SlurmdLogFile={s}/slurmd.log",
            f"NodeName=localhost NodeAddr=127.0.0.1 {_node_hardware()} State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def _write_config(self) -> None:
        if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text():
            raise Unavailable(f"{SLURM_CONF} exists and was not written by these tests: this machine looks like "
                              "part of a real Slurm installation, whose configuration the tests will not replace")
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(self.config_text())

    def _start_munge(self) -> None:
        if _run("sh", "-c", "munge -n | unmunge", check=False).returncode == 0:
            return  # a munged already runs here: use it, and leave it running
        munge = pwd.getpwnam("munge")
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(os.urandom(1024))
            os.chown(key, munge.pw_uid, munge.pw_gid)
            key.chmod(0o400)
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        os.chown(run_dir, munge.pw_uid, munge.pw_gid)
        # munged refuses to run as root; as its own user it needs nothing else
        _run("su", "-s", "/bin/sh", "munge", "-c", _program("munged"))
        self.started.append(("munged", run_dir / "munged.pid"))
        _wait_for(lambda: _run("sh", "-c", "munge -n | unmunge", check=False).returncode == 0, 30, "munged")

    def start(self) -> "SlurmNode":
        for folder in ("state", "spool"):
            (self.state / folder).mkdir(parents=True, exist_ok=True)
        try:
            self._write_config()
            self._start_munge()
            _run(_program("slurmctld"), "-c")  # -c: a clean start, no jobs from an earlier cluster
            self.started.append(("slurmctld", self.state / "slurmctld.pid"))
            _wait_for(lambda: _run("sinfo", "-h", check=False).returncode == 0, 60, "slurmctld",
                      self.state / "slurmctld.log")
            _run(_program("slurmd"), "-N", "localhost")
            self.started.append(("slurmd", self.state / "slurmd.pid"))
            _wait_for(lambda: _run("sinfo", "-h", "-N", "-o", "%t").stdout.strip() == "idle", 60,
                      "the node to register as idle", self.state / "slurmd.log")
        except BaseException:
            self.stop()
            raise
        return self

    def jobs(self) -> list[dict]:
        """Queued, running and recently ended jobs: id, state and Snakemake's comment (rule_<rule>_wildcards_...)."""
        listing = _run("squeue", "-h", "-t", "all", "-o", "%i|%T|%k").stdout
        return [dict(zip(("id", "state", "comment"), line.split("|", 2))) for line in listing.splitlines() if line]

    def stop(self) -> None:
        if any(name == "slurmctld" for name, _ in self.started):
            _run("scancel", "--user", pwd.getpwuid(os.geteuid()).pw_name, check=False)
            try:
                _wait_for(lambda: not any(j["state"] in ("RUNNING", "PENDING", "COMPLETING") for j in self.jobs()),
                          30, "cancelled jobs to end")
            except RuntimeError:
                pass  # the daemons are stopped below regardless
        for name, pid_file in reversed(self.started):
            pid = _read_pid(pid_file)
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 30
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
        self.started.clear()
        # With a slurm.conf but no controller, `scontrol` retries for 9 s, and Snakemake's Slurm plugin calls it
        # whenever Snakemake starts: every later test's snakemake would wait that long.
        if SLURM_CONF.exists() and MARKER in SLURM_CONF.read_text():
            SLURM_CONF.unlink()
