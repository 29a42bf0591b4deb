"""Every fine-tuning method, stated once and without torch: its name, what tables and figures call it, what one
step does, and which of the paper's terms it uses. Everything else reads this table: the step functions
(training/dp_step.py `STEPS`, one per method, taking exactly the method's `hyperparameters` by name), the training
loop and its record, the report's labels, rows and figure order, the rules, the CLI help; the config schema's
method enums are held equal to it by tests/test_methods.py.

Adding a method: one `Method(...)` here and one step function in training/dp_step.py (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("reference", "baseline", "proposed", "ablation", "pretrained")


@dataclass(frozen=True)
class Method:
    name: str
    label: str  # what tables and figures call it (the paper's words)
    summary: str  # one line: what one step does (schema, --help, docs)
    private: bool
    # reference: non-private; baseline: what the proposal is measured against (naive DP); proposed: the paper's
    # DP-Merging; ablation: a variant shown beside it against the baseline; pretrained: w0 with a head only
    role: str
    flatness: bool = False  # a SAM ascent of radius rho before the gradient that is used (Eq. 5-6)
    # the ascent follows the previous step's privatized gradient (DPSAT, Park et al., ICML 2023), already released
    # to the optimizer, so a step makes one query instead of DP-SAM's two on the same batch
    one_query: bool = False
    anchor: bool = False  # Eq. (7)'s 2 lambda (w - w0), added after privatization
    # w0 stays as it is and only the head learns (under DP, at the same budget): the score a merge must beat
    head_only: bool = False
    ablation_row: str | None = None  # its row in Table 5 (the ablation), None where it is not one

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"method {self.name}: role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.one_query and not self.flatness:
            raise ValueError(f"method {self.name}: one_query is a way of doing flatness; set flatness too")

    @property
    def queries_per_step(self) -> int:
        return 2 if self.flatness and not self.one_query else 1

    @property
    def hyperparameters(self) -> tuple[str, ...]:
        """The settings its step function takes, by name (the finetune config's fields)."""
        return ("rho",) * self.flatness + ("anchor_lambda",) * self.anchor

    @property
    def merged(self) -> bool:
        """Its task vectors are merged (a head-only run's are zero)."""
        return not self.head_only


# In the order tables list them (Table 5's rows follow it).
_METHODS = (
    Method("nonprivate", "Non-private", "AdamW without privacy (reference; epsilon = inf)", False, "reference"),
    Method("naive_dp", "DP", "DP-AdamW: per-sample clipping, Gaussian noise, Poisson sampling (Eq. 4)", True,
           "baseline", ablation_row="DP"),
    Method("dp_sam", "DP-Merging w/o alignment", "DP-Merging without alignment (lambda = 0): DP-SAM alone", True,
           "ablation", flatness=True, ablation_row="w/o Alignment"),
    Method("dp_anchor", "DP-Merging w/o flatness",
           "DP-Merging without flatness (rho = 0): the anchor on one query per step", True, "ablation",
           anchor=True, ablation_row="w/o Flatness"),
    Method("dp_merging", "DP-Merging", "DP-SAM (two noisy clipped queries per batch) + anchor to w0 (Eq. 4-7)",
           True, "proposed", flatness=True, anchor=True, ablation_row="DP-Merging (full)"),
    # DPSAT's one-query flatness: flatness without DP-SAM's sqrt(2) noise
    Method("dp_sat", "DPSAT (one query)",
           "DPSAT: SAM ascent along the previous step's privatized gradient, one query per step", True, "ablation",
           flatness=True, one_query=True, ablation_row="DPSAT (one query)"),
    Method("dp_sat_anchor", "DPSAT + anchor (one query)",
           "DPSAT + anchor to w0: DP-Merging's two terms at one query per step", True, "ablation", flatness=True,
           one_query=True, anchor=True, ablation_row="DPSAT + anchor (one query)"),
    Method("pretrained_head", "Pretrained",
           "w0 unchanged, a head trained by DP-AdamW at the same budget (CLIP: its zero-shot heads, nothing "
           "trained); the Pretrained row, the score a merge must beat", True, "pretrained", head_only=True),
)
METHODS: dict[str, Method] = {method.name: method for method in _METHODS}
BASELINE = next(m.name for m in _METHODS if m.role == "baseline")
PROPOSED = next(m.name for m in _METHODS if m.role == "proposed")
# Shown beside the proposal against the baseline, when configured (Table 1's extra rows, Table 5)
ABLATIONS = tuple(m.name for m in _METHODS if m.role == "ablation")
PRIVATE_MERGED_METHODS = tuple(m.name for m in _METHODS if m.private and m.merged)
# Figures draw every merged method, the proposal last so that it lies on top
FIGURE_ORDER = tuple(m.name for m in _METHODS if m.merged and m.role != "proposed") + (PROPOSED,)


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
