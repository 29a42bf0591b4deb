"""Figures from small synthetic diagnostic frames: files are written, and what is drawn carries the numbers."""

import math

import numpy as np
import pandas as pd
import pytest

from dpmerge.report import figures


def curvature_frame(epsilons=("1.0", "2.0", "4.0")):
    """Sharpness of task model t at epsilon e and seed s: k/e + 0.2 s (+0.1 on task b), k = 1 for DP-Merging and
    2 for naive DP; non-private 0.05. Every operator's row repeats its task model's sharpness."""
    rows = []
    runs = [(m, e, k) for m, k in (("naive_dp", 2.0), ("dp_merging", 1.0)) for e in epsilons]
    for method, eps, k in runs + [("nonprivate", "None", None)]:
        for seed in (0, 1):
            for task, offset in (("a", 0.0), ("b", 0.1)):
                sharp = 0.05 if k is None else k / float(eps) + 0.2 * seed + offset
                for operator in ("ties", "weight_averaging"):
                    gap = 0.01 * (seed + 1)
                    rows.append(dict(backbone="vit", method=method, target_epsilon=eps, seed=seed, operator=operator,
                                     task=task, rho=0.05, sharpness=sharp, merge_gap=gap, bound=gap * 1e4,
                                     lambda_max_at_task=2.0, displacement=0.3, task_loss=1.0, merged_loss=1.0 + gap))
    return pd.DataFrame(rows)


def drift_frame(epsilons=("1.0", "2.0", "4.0")):
    rows = []
    for method, k in (("naive_dp", 0.02), ("dp_merging", 0.01)):
        for eps in epsilons:
            for seed in (0, 1):
                for task in ("a", "b"):
                    rows.append(dict(backbone="vit", method=method, target_epsilon=eps, seed=seed, task=task,
                                     drift=0.0, mean_drift=k / float(eps) + 0.002 * seed))
    for seed in (0, 1):
        rows.append(dict(backbone="vit", method="nonprivate", target_epsilon="inf", seed=seed, task="a", drift=0.0,
                         mean_drift=0.5))
    return pd.DataFrame(rows)


@pytest.fixture
def drawn(monkeypatch):
    """Each saved figure's panels: per axis, {legend label: artist}, tick labels, labels and scales, read before
    the figure is closed."""
    seen = []
    save = figures.save_figure

    def record(fig, out):
        panels = []
        for ax in fig.axes:
            handles, labels = ax.get_legend_handles_labels()
            panels.append(dict(artists=dict(zip(labels, handles)), xticks=[t.get_text() for t in ax.get_xticklabels()],
                               xlabel=ax.get_xlabel(),
                               ylabel=ax.get_ylabel(), xscale=ax.get_xscale(), yscale=ax.get_yscale()))
        seen.append(panels)
        save(fig, out)

    monkeypatch.setattr(figures, "save_figure", record)
    return seen


def assert_written(*paths):
    png, pdf = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 2000


@pytest.mark.slow
def test_sharpness_and_drift_against_epsilon(tmp_path, drawn):
    outs = [tmp_path / "fig3.png", tmp_path / "fig3.pdf"]
    figures.plot_sharpness_drift(curvature_frame(), drift_frame(), outs, "Fig. 3")
    assert_written(*outs)
    sharpness, drift = drawn[0]
    assert sharpness["xscale"] == "log" and sharpness["xticks"] == ["1", "2", "4"]
    assert "privacy budget ε" == sharpness["xlabel"] and "(nats)" in sharpness["ylabel"]
    assert "(ratio)" in drift["ylabel"]
    # per seed the average over tasks is k/e + 0.2 s + 0.05; over seeds 0 and 1: k/e + 0.15, std 0.2/sqrt(2)
    ours = sharpness["artists"]["DP-Merging"]
    assert ours.lines[0].get_ydata() == pytest.approx([1.15, 0.65, 0.40])
    assert ours.lines[0].get_linestyle() == "-"
    assert sharpness["artists"]["DP"].lines[0].get_ydata() == pytest.approx([2.15, 1.15, 0.65])
    bar = ours.lines[2][0].get_segments()[0]  # the error bar at epsilon 1
    assert bar[1][1] - bar[0][1] == pytest.approx(2 * 0.2 / math.sqrt(2))
    reference = sharpness["artists"]["Non-private (ε = ∞)"]
    assert reference.get_ydata() == pytest.approx([0.05, 0.05]) and reference.get_linestyle() == "--"
    assert drift["artists"]["DP"].lines[0].get_ydata() == pytest.approx([0.021, 0.011, 0.006])
    assert drift["artists"]["Non-private (ε = ∞)"].get_ydata() == pytest.approx([0.5, 0.5])
    # the two methods differ in line style and marker, not only in grey
    dp = sharpness["artists"]["DP"].lines[0]
    assert (dp.get_linestyle(), dp.get_marker()) != (ours.lines[0].get_linestyle(), ours.lines[0].get_marker())


@pytest.mark.slow
def test_one_epsilon_draws_points(tmp_path, drawn):
    outs = [tmp_path / "one.png", tmp_path / "one.pdf"]
    figures.plot_sharpness_drift(curvature_frame(("4.0",)), drift_frame(("4.0",)), outs, "one budget")
    assert_written(*outs)
    sharpness, _ = drawn[0]
    assert sharpness["xticks"] == ["4"]
    line = sharpness["artists"]["DP-Merging"].lines[0]
    assert line.get_linestyle() == "None" and line.get_ydata() == pytest.approx([0.40])


def test_sharpness_needs_a_private_run_and_one_backbone(tmp_path):
    curvature, drift = curvature_frame(), drift_frame()
    with pytest.raises(ValueError, match="no private"):
        figures.plot_sharpness_drift(curvature.query("method == 'nonprivate'"),
                                     drift.query("method == 'nonprivate'"), tmp_path / "x.png", "")
    with pytest.raises(ValueError, match="several backbone"):
        other = curvature.assign(backbone="roberta")
        figures.plot_sharpness_drift(pd.concat([curvature, other]), drift, tmp_path / "x.png", "")


@pytest.mark.slow
def test_gap_against_bound_and_estimate(tmp_path, drawn):
    outs = [tmp_path / "gap.png", tmp_path / "gap.pdf"]
    figures.plot_gap_vs_bound(curvature_frame(), outs, "gaps")
    assert_written(*outs)
    bound, estimate = drawn[0]
    assert bound["xscale"] == bound["yscale"] == "log" == estimate["xscale"]
    assert {"DP", "DP-Merging", "Non-private", "y = x"} <= set(bound["artists"])
    assert "median bound / gap = 1e+04" in bound["artists"]
    # Eq. (3): 1/2 * 2.0 * 0.3^2 = 0.09 against gaps 0.01 and 0.02: median ratio of (9, 4.5) is 6.75
    assert "median estimate / gap = 6.8" in estimate["artists"]
    points = bound["artists"]["DP-Merging"].get_offsets()
    assert sorted(points[:, 1]) == pytest.approx([0.01] * 12 + [0.02] * 12)
    assert not any("≤ 0" in label for label in bound["artists"])


@pytest.mark.slow
def test_non_positive_gaps_are_drawn_at_a_floor_and_counted(tmp_path, drawn):
    curvature = curvature_frame().reset_index(drop=True)
    curvature.loc[0, "merge_gap"] = -0.003
    curvature.loc[1, "merge_gap"] = 0.0
    curvature.loc[2, "bound"] = np.nan
    outs = [tmp_path / "gap.png", tmp_path / "gap.pdf"]
    figures.plot_gap_vs_bound(curvature, outs, "gaps")
    assert_written(*outs)
    bound, estimate = drawn[0]
    # smallest positive value 0.01 -> floor 1e-3; rows 0 and 1 drawn there, row 2 (NaN bound) counted in a note
    assert "hollow: value ≤ 0, drawn at 1e-03 (n = 2)" in bound["artists"]
    assert "1 row with a non-finite value not shown" in bound["artists"]
    assert "hollow: value ≤ 0, drawn at 1e-03 (n = 2)" in estimate["artists"]
    assert not any("non-finite" in label for label in estimate["artists"])


def test_interpolation_figure_moved_to_figures(tmp_path):
    curves = pd.DataFrame([dict(task=t, method=m, gamma=g, loss=1.0 + g * (m == "naive_dp"))
                           for t in ("a", "b") for m in ("naive_dp", "dp_merging") for g in (0.0, 0.5, 1.0)])
    outs = [tmp_path / "fig2.png", tmp_path / "fig2.pdf"]
    for out in outs:
        figures.plot_interpolation(curves, out, "Fig. 2")
    assert_written(*outs)


def test_sharpness_radius_read_from_new_and_old_curvature_files(monkeypatch, tmp_path):
    """Newer curvature files name the diagnostic's radius sharpness_rho and use rho for the fine-tuning's SAM
    radius (0 for naive DP, so it varies); files written before that have rho only. Mixed, the radius shown is
    the diagnostic's and the fine-tuning's rho is not mistaken for it."""
    old = curvature_frame().query("seed == 0")
    new = curvature_frame().query("seed == 1").assign(sharpness_rho=0.05)
    new["rho"] = np.where(new["method"] == "dp_merging", 0.05, 0.0)
    titles = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out: titles.append(fig.axes[0].get_title()))
    figures.plot_sharpness_drift(pd.concat([old, new]), drift_frame(), tmp_path / "f.png", "t")
    assert titles == ["(a) average sharpness over tasks (ρ = 0.05)"]
    with pytest.raises(ValueError, match="several sharpness_rho values"):
        figures.plot_sharpness_drift(pd.concat([old.assign(sharpness_rho=0.1), new]), drift_frame(),
                                     tmp_path / "g.png", "t")


def test_the_same_figure_gives_the_same_pdf_bytes_at_another_time(tmp_path, monkeypatch):
    """No creation date in a PDF: a rerun (or a refactoring) can be checked by comparing files."""
    plt = figures._pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    paths = []
    for epoch in ("1000000000", "2000000000"):  # matplotlib dates a PDF from SOURCE_DATE_EPOCH when it is set
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
        paths.append(tmp_path / f"at{epoch}.pdf")
        figures.save_figure(fig, paths[-1])
    plt.close(fig)
    assert paths[0].read_bytes() == paths[1].read_bytes()
