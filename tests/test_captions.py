"""Table captions and figure titles (dpmerge.report.captions): the exact strings the workflow passed to
`dpmerge table --caption` and `dpmerge plot-* --title` when workflow/rules/common.smk still wrote them itself, and
a module the workflow can import while planning, without torch, numpy or pandas."""

import subprocess
import sys

import pytest

from dpmerge.report import captions


def test_seeds_note():
    assert captions.seeds_note(1) == "one seed"
    assert captions.seeds_note(3) == "mean ± std over 3 seeds, improvements as mean paired difference [95 % t-interval]"


@pytest.mark.parametrize("n_seeds, note", [(1, "one seed"),
                                           (3, "mean ± std over 3 seeds, improvements as mean paired difference "
                                               "[95 % t-interval]")])
def test_table_captions(n_seeds, note):
    assert captions.multitask_table_caption(backbone="minilm", kind="minilm_l6", epsilon=4.0, n_seeds=n_seeds) == (
        f"Multi-task scores (0-100, each task's own metric) with minilm_l6 (minilm), epsilon = 4, {note}.")
    assert captions.multitask_table_caption(backbone="vit-b32", kind="clip_vit_b32", epsilon=0.5,
                                            n_seeds=n_seeds) == (
        f"Multi-task scores (0-100, each task's own metric) with clip_vit_b32 (vit-b32), epsilon = 0.5, {note}.")
    assert captions.multitask_table_caption(backbone="vit-b32", kind="clip_vit_b32", epsilon=0.5, n_seeds=n_seeds,
                                            pretrained="zeroshot").endswith(
        f"{note}. Pretrained: w0 with its zero-shot heads (nothing trained); the score a merge must beat.")
    assert captions.ablation_table_caption(backbone="effnet", kind="efficientnet_lite0", epsilon=8.0,
                                           n_seeds=n_seeds) == (
        "Ablation of DP-Merging with efficientnet_lite0 (effnet), epsilon = 8: average score over tasks (0-100) of "
        "the individual models and each merge; w/o Alignment = lambda 0 (DP-SAM only), w/o Flatness = rho 0 "
        f"(anchor only); {note}.")
    assert captions.operators_table_caption(backbone="effnet", kind="efficientnet_lite0", epsilon=1.0,
                                            n_seeds=n_seeds) == (
        "Robustness to the merge operator with efficientnet_lite0 (effnet), epsilon = 1: average score over tasks "
        f"(0-100), {note}.")


def test_epsilon_sweep_caption_names_the_operator_by_its_label():
    assert captions.epsilon_sweep_table_caption(operator="ties", n_seeds=1) == (
        "Average merged score (0-100) with TIES at each privacy budget epsilon: naive DP vs DP-Merging, per "
        "backbone, one seed.")
    assert captions.epsilon_sweep_table_caption(operator="ties_difference", n_seeds=3) == (
        "Average merged score (0-100) with TIES (difference vectors) at each privacy budget epsilon: naive DP vs "
        "DP-Merging, per backbone, mean ± std over 3 seeds, improvements as mean paired difference [95 % t-interval].")


def test_sensitivity_captions_of_tables_6_and_7():
    assert captions.sensitivity_table_caption(parameter="rho", method="dp_merging", operator="ties",
                                              backbone="effnet", kind="efficientnet_lite0", epsilon=4.0,
                                              n_seeds=1) == (
        "Sensitivity of dp_merging + TIES to rho with efficientnet_lite0 (effnet), epsilon = 4, lambda at its "
        "configured value; scores 0-100, one seed.")
    assert captions.sensitivity_table_caption(parameter="anchor_lambda", method="dp_anchor",
                                              operator="ties_difference", backbone="minilm", kind="minilm_l6",
                                              epsilon=0.5, n_seeds=3) == (
        "Sensitivity of dp_anchor + TIES (difference vectors) to lambda with minilm_l6 (minilm), epsilon = 0.5, "
        "rho at its configured value; scores 0-100, mean ± std over 3 seeds, improvements as mean paired difference "
        "[95 % t-interval].")


def test_figure_titles():
    assert captions.interpolation_figure_title(backbone="effnet", epsilon=0.5, operator="weight_averaging") == (
        "effnet, epsilon = 0.5: path from task model to weight_averaging merge")
    assert captions.sharpness_drift_figure_title(backbone="minilm", kind="minilm_l6") == (
        "minilm (minilm_l6): sharpness and reference drift vs epsilon")
    assert captions.gap_bound_figure_title(backbone="vit-b32", operator="ties") == (
        "vit-b32: measured merge gap to ties vs Theorem 5.2's bound")
    assert captions.landscape_figure_title(backbone="effnet", epsilon=4.0, operator="task_arithmetic") == (
        "effnet, epsilon = 4: loss landscape around the task_arithmetic merge (mean test loss over tasks)")


def test_the_catalog_re_exports_them():
    from dpmerge import catalog

    for name in ("multitask_table_caption", "epsilon_sweep_table_caption", "ablation_table_caption",
                 "sensitivity_table_caption", "operators_table_caption", "interpolation_figure_title",
                 "sharpness_drift_figure_title", "gap_bound_figure_title", "landscape_figure_title"):
        assert getattr(catalog, name) is getattr(captions, name)


def test_importing_captions_loads_no_torch_numpy_or_pandas():
    code = ("import sys, dpmerge.report.captions; "
            "print(sorted(m for m in ('torch', 'numpy', 'pandas') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
