"""How long torch's idle OpenMP worker threads spin before they sleep.

libgomp (the OpenMP runtime torch's CPU wheels load) keeps a worker spinning for up to 300,000 iterations after
each parallel region (GOMP_SPINCOUNT's default), so the other core is busy for milliseconds after every op even
when no op follows. A DP step's Gaussian noise is drawn by several keyed generators on a thread pool
(privacy/randomness.py) right after the clipped sum, and beside a spinning worker the second thread gained
nothing. With the spin cut to SPIN_COUNT iterations the worker yields the core soon after the clipped sum and
the noise is drawn on both (bench/dp_step.py, docs/performance.md, "The DP step"); a non-private step, whose ops
follow each other within microseconds, is as fast as before. Spinning changes only timing, never a result.

libgomp reads its settings once, when torch first loads it, so this must run before anything imports torch;
`dpmerge.launch` calls it first (the fork server inherits the environment). A user's own GOMP_SPINCOUNT or
OMP_WAIT_POLICY is left as it is. Standard library only.
"""

from __future__ import annotations

from collections.abc import MutableMapping

SPIN_COUNT = 10_000


def limit_spinning(environment: MutableMapping[str, str]) -> None:
    """Set GOMP_SPINCOUNT to SPIN_COUNT in `environment` (os.environ, for the process itself) unless the user
    chose a spin count or a wait policy."""
    if "GOMP_SPINCOUNT" in environment or "OMP_WAIT_POLICY" in environment:
        return
    environment["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
