"""The captions of the paper's tables and the titles of its figures, as the workflow passes them to
`dpmerge table --caption` and `dpmerge plot-* --title`.

Plain functions of plain values (a backbone's name and kind, a budget as a float, an operator's name, the number
of seeds), with no torch, numpy or pandas: workflow/rules/captions.smk turns a rule's wildcards and the config into
these values and calls them while Snakemake plans the jobs.
"""

from __future__ import annotations

from dpmerge.methods import METHODS
from dpmerge.report.labels import operator_label


def seeds_note(n_seeds: int | list[int]) -> str:
    """How a table's cells summarise the seeds; a list: the distinct seed counts of the backbones it spans."""
    counts = sorted(set(n_seeds)) if isinstance(n_seeds, (list, tuple)) else [n_seeds]
    if counts == [1]:
        return "one seed"
    how_many = str(counts[0]) if len(counts) == 1 else f"{', '.join(map(str, counts))} (per backbone)"
    return f"mean ± std over {how_many} seeds, improvements as mean paired difference [95 % t-interval]"


def multitask_table_caption(*, backbone: str, kind: str, epsilon: float, n_seeds: int,
                            pretrained: str | None = None) -> str:
    """Table 1: per-task scores of each method's individual models and merges at one budget. `pretrained`
    says what the Pretrained row's heads are ("dp": trained under DP at this budget, "zeroshot")."""
    heads = {"dp": " Pretrained: w0 unchanged, each task's head trained under DP at the same budget; the score a "
                   "merge must beat.",
             "zeroshot": " Pretrained: w0 with its zero-shot heads (nothing trained); the score a merge must beat.",
             None: ""}[pretrained]
    return (
        f"Multi-task scores (0-100, each task's own metric) with {kind} ({backbone}), "
        f"epsilon = {epsilon:g}, {seeds_note(n_seeds)}.{heads}"
    )


def epsilon_sweep_table_caption(*, operator: str, n_seeds: int | list[int]) -> str:
    """Table 4: the average merged score with the tables' operator at each budget."""
    return (f"Average merged score (0-100) with {operator_label(operator)} at each privacy budget epsilon: "
            f"naive DP vs DP-Merging, per backbone, {seeds_note(n_seeds)}.")


def ablation_table_caption(*, backbone: str, kind: str, epsilon: float, n_seeds: int,
                           one_query: list[str] | tuple[str, ...] = ()) -> str:
    """Table 5: DP-Merging without its alignment or its flatness term (and DPSAT's rows when `one_query` names
    them)."""
    dpsat = ""
    if one_query:
        rows = " and ".join(METHODS[m].label.removesuffix(" (one query)") for m in one_query)
        dpsat = (f"; {rows}: the SAM ascent along the previous step's privatized gradient, one query per step "
                 f"(Park et al., ICML 2023), so less noise than DP-SAM's two at the same epsilon")
    return (f"Ablation of DP-Merging with {kind} ({backbone}), epsilon = "
            f"{epsilon:g}: average score over tasks (0-100) of the individual models and each merge; "
            f"w/o Alignment = lambda 0 (DP-SAM only), w/o Flatness = rho 0 (anchor only){dpsat}; "
            f"{seeds_note(n_seeds)}.")


def sensitivity_table_caption(*, parameter: str, method: str, operator: str, backbone: str, kind: str,
                              epsilon: float, n_seeds: int) -> str:
    """Tables 6 (parameter 'rho') and 7 ('anchor_lambda'): the swept method's scores at each value of one
    hyperparameter, the other held at its configured value."""
    symbol = "rho" if parameter == "rho" else "lambda"
    other = "lambda" if parameter == "rho" else "rho"
    return (f"Sensitivity of {method} + {operator_label(operator)} to {symbol} "
            f"with {kind} ({backbone}), epsilon = "
            f"{epsilon:g}, {other} at its configured value; scores 0-100, "
            f"{seeds_note(n_seeds)}.")


def operators_table_caption(*, backbone: str, kind: str, epsilon: float, n_seeds: int) -> str:
    """Table 8: every configured merge operator at one budget."""
    return (f"Robustness to the merge operator with {kind} ({backbone}), epsilon = "
            f"{epsilon:g}: average score over tasks (0-100), {seeds_note(n_seeds)}.")


def interpolation_figure_title(*, backbone: str, epsilon: float, operator: str) -> str:
    """Fig. 2: loss paths from each task model to the diagnostic's merge."""
    return f"{backbone}, epsilon = {epsilon:g}: path from task model to {operator} merge"


def sharpness_drift_figure_title(*, backbone: str, kind: str) -> str:
    """Fig. 3: sharpness and reference drift against the budget."""
    return f"{backbone} ({kind}): sharpness and reference drift vs epsilon"


def gap_bound_figure_title(*, backbone: str, operator: str) -> str:
    """The measured merge gap beside Theorem 5.2's bound."""
    return f"{backbone}: measured merge gap to {operator} vs Theorem 5.2's bound"


def landscape_figure_title(*, backbone: str, epsilon: float, operator: str) -> str:
    """Figs. 4, 5: the loss landscape around the diagnostic's merge."""
    return (f"{backbone}, epsilon = {epsilon:g}: loss landscape around the {operator} "
            f"merge (mean test loss over tasks)")
