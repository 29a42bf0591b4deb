"""Fine-tuning methods by name: what each does per step (kept free of heavy imports for the Snakefile)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    private: bool
    sharpness_aware: bool
    anchored: bool
    description: str

    @property
    def queries_per_step(self) -> int:
        return 2 if self.sharpness_aware else 1


METHODS: dict[str, Method] = {
    "nonprivate": Method("nonprivate", False, False, False, "AdamW without privacy (reference; epsilon = inf)"),
    "naive_dp": Method("naive_dp", True, False, False, "DP-AdamW: per-sample clipping, Gaussian noise, Poisson sampling"),
    "dp_merging": Method("dp_merging", True, True, True, "DP-SAM (two noisy clipped queries per batch) + anchor to w0"),
    "dp_sam": Method("dp_sam", True, True, False, "DP-Merging without alignment (lambda = 0)"),
    "dp_anchor": Method("dp_anchor", True, False, True, "DP-Merging without flatness (anchor only, one query per step)"),
}
