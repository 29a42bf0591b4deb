"""The `dpmerge` command: through the warm fork server when DPMERGE_FORKSERVER=1, else in this process.

Kept to the standard library so the path through the server costs no import; anything the server cannot do
(none listening yet, a platform without Unix sockets or fork) falls back to running here, with the same result.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    argv = sys.argv[1:]
    from dpmerge import gpu_slots, openmp_wait

    # Both set environment variables: before torch loads (libgomp and CUDA read them once) and before the fork
    # server's socket is chosen (it is keyed by the environment).
    openmp_wait.limit_spinning(os.environ)
    gpu_slots.claim_for_job(os.environ, log=gpu_slots.to_stderr)
    if os.environ.get("DPMERGE_FORKSERVER") == "1" and hasattr(os, "fork"):
        from dpmerge import forkserver

        try:
            sys.exit(forkserver.call(argv))
        except forkserver.Unavailable:
            pass
    from dpmerge import cli

    cli.main(argv)


if __name__ == "__main__":
    main()
