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
    # w0 stays as it is and only the head learns (under DP, at the same budget): the score a merge must beat
    head_only: bool = False
    # DPSAT (Park et al., ICML 2023): the SAM ascent follows the previous step's privatized gradient, which is
    # already released to the optimizer, so the step makes one query instead of DP-SAM's two on the same batch
    ascent_from_previous_step: bool = False

    @property
    def queries_per_step(self) -> int:
        return 2 if self.sharpness_aware and not self.ascent_from_previous_step else 1


METHODS: dict[str, Method] = {
    "nonprivate": Method("nonprivate", False, False, False, "AdamW without privacy (reference; epsilon = inf)"),
    "naive_dp": Method("naive_dp", True, False, False, "DP-AdamW: per-sample clipping, Gaussian noise, Poisson sampling"),
    "dp_merging": Method("dp_merging", True, True, True, "DP-SAM (two noisy clipped queries per batch) + anchor to w0"),
    "dp_sam": Method("dp_sam", True, True, False, "DP-Merging without alignment (lambda = 0)"),
    "dp_anchor": Method("dp_anchor", True, False, True, "DP-Merging without flatness (anchor only, one query per step)"),
    "dp_sat": Method("dp_sat", True, True, False,
                     "DPSAT: SAM ascent along the previous step's privatized gradient, one query per step",
                     ascent_from_previous_step=True),
    "dp_sat_anchor": Method("dp_sat_anchor", True, True, True,
                            "DPSAT + anchor to w0: DP-Merging's two terms at one query per step",
                            ascent_from_previous_step=True),
    "pretrained_head": Method("pretrained_head", True, False, False,
                              "w0 unchanged, a head trained by DP-AdamW at the same budget (CLIP: its zero-shot "
                              "heads, nothing trained); the Pretrained row, the score a merge must beat",
                              head_only=True),
}


# A sweep fine-tunes a method again at another value of one hyperparameter (paper Tables 6, 7: rho, lambda; the
# effective-noise study: lr, expected batch size, weight decay); its release groups are labelled
# "<method>-<short name><value>", e.g. dp_merging-rho0.1, naive_dp-lr0.02, nonprivate-B16. No short name is a
# prefix of another.
SWEPT_PARAMETERS: dict[str, str] = {"rho": "rho", "anchor_lambda": "lambda", "lr": "lr", "batch_size": "B",
                                    "weight_decay": "wd"}


def sweep_label(method: str, parameter: str, value: float) -> str:
    return f"{method}-{SWEPT_PARAMETERS[parameter]}{float(value):g}"


def parse_label(label: str) -> tuple[str, dict[str, float]]:
    """(method, {parameter: value}) of a release-group label: 'dp_merging-rho0.1' -> ('dp_merging', {'rho': 0.1})."""
    method, _, suffix = label.partition("-")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} in {label!r}; known: {', '.join(METHODS)}")
    if not suffix:
        return method, {}
    for parameter, short in SWEPT_PARAMETERS.items():
        if suffix.startswith(short):
            try:
                return method, {parameter: float(suffix.removeprefix(short))}
            except ValueError:
                break
    raise ValueError(f"{label!r}: expected <method>-<{'|'.join(SWEPT_PARAMETERS.values())}><value>, "
                     f"e.g. {sweep_label(method, 'rho', 0.1)}")
