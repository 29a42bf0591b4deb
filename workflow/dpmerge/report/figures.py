"""Paper figures (matplotlib, PNG + PDF), readable in greyscale: every line and marker differs in style, not only
in colour, and every axis names its quantity and unit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.artifacts import atomic_write
from dpmerge.epsilon import epsilon_value
from dpmerge.methods import FIGURE_ORDER
from dpmerge.report.labels import METHOD_LABELS, operator_label

# One look per method in every figure, told apart in greyscale by line style and marker: (line, marker, grey)
METHOD_STYLES = {
    "dp_merging": ("-", "o", "0.0"),
    "naive_dp": ("-.", "s", "0.45"),
    "dp_sam": (":", "^", "0.25"),
    "dp_anchor": ((0, (5, 1, 1, 1, 1, 1)), "D", "0.55"),
    "nonprivate": ("--", "v", "0.6"),
    "dp_sat": ((0, (1, 1)), "<", "0.3"),
    "dp_sat_anchor": ((0, (4, 2, 1, 2)), ">", "0.1"),
}
_OTHER_STYLES = [((0, (1, 2)), "P", "0.35"), ((0, (8, 2)), "X", "0.5"), ((0, (3, 3)), "*", "0.15")]
METHOD_ORDER = FIGURE_ORDER


def save_figure(fig, out: str | Path) -> None:
    """Write one figure atomically in the format its suffix names (.png at 120 dpi or .pdf).

    A PDF gets no creation date, so the same results give the same bytes (a rerun or a refactoring can be
    checked by comparing files)."""
    out = Path(out)
    kind = out.suffix.lstrip(".")
    metadata = {"CreationDate": None} if kind == "pdf" else None
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=120, format=kind, metadata=metadata))


def _save_all(fig, out) -> None:
    """save_figure to one path or to each of several (one drawing, e.g. both .png and .pdf)."""
    for path in [out] if isinstance(out, (str, Path)) else out:
        save_figure(fig, path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ordered_methods(methods) -> list[str]:
    """The methods present, in the figures' order (methods.FIGURE_ORDER), others after it in order of appearance."""
    present = list(dict.fromkeys(methods))
    return [m for m in METHOD_ORDER if m in present] + [m for m in present if m not in METHOD_ORDER]


def _methods(frame: pd.DataFrame) -> list[str]:
    return ordered_methods(frame["method"])


def _style(method: str, index: int) -> tuple:
    return METHOD_STYLES.get(method) or _OTHER_STYLES[index % len(_OTHER_STYLES)]


def _require(frame: pd.DataFrame, needed: set[str], what: str) -> None:
    if missing := needed - set(frame.columns):
        raise ValueError(f"{what} frame lacks columns {sorted(missing)}")
    if frame.empty:
        raise ValueError(f"{what} frame has no rows")


def _one_value(frame: pd.DataFrame, column: str, what: str) -> None:
    if column in frame.columns and frame[column].nunique() > 1:
        raise ValueError(f"{what} mixes several {column} values {sorted(frame[column].unique())}; pass one's")


def plot_interpolation(curves: pd.DataFrame, out, title: str) -> None:
    """Fig. 2: test loss along (1-gamma) w_t + gamma w_merge, one panel per task, one line per method.
    `out`: one path or several (.png, .pdf)."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(curves["task"]))
    methods = _methods(curves)
    cols = min(4, len(tasks))
    rows = int(np.ceil(len(tasks) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    try:
        for ax, task in zip(axes.flat, tasks):
            for index, method in enumerate(methods):
                line, marker, grey = _style(method, index)
                sel = curves[(curves["task"] == task) & (curves["method"] == method)]
                sel = sel.groupby("gamma", as_index=False)["loss"].mean()
                ax.plot(sel["gamma"], sel["loss"], linestyle=line, marker=marker, color=grey, markersize=3,
                        label=METHOD_LABELS.get(method, method))
            ax.set_title(task, fontsize=9)
            ax.set_xlabel(r"$\gamma$ (0 = task model, 1 = merged)")
            ax.set_ylabel("test loss (cross-entropy, nats)")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(tasks):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=8)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        _save_all(fig, out)
    finally:
        plt.close(fig)


def _epsilon_panel(ax, per_seed: pd.Series, ylabel: str) -> None:
    """One line per method of the mean over seeds against epsilon (log2 axis, ticks at the budgets present),
    error bars = sample std over seeds where there are several; infinite epsilon = dashed horizontal line."""
    from matplotlib.ticker import NullLocator

    stats = per_seed.groupby(level=["method", "epsilon"], dropna=False).agg(["mean", "std", "count"])
    budgets = sorted({e for e in stats.index.get_level_values("epsilon") if np.isfinite(e)})
    if not budgets:
        raise ValueError("nothing to plot against epsilon: no private (finite epsilon) runs")
    methods = _methods(stats.index.to_frame(index=False))
    private = [m for m in methods if np.isfinite(stats.loc[m].index).any()]
    for index, method in enumerate(methods):
        line, marker, grey = _style(method, index)
        label = METHOD_LABELS.get(method, method)
        rows = stats.loc[method]
        finite = rows[np.isfinite(rows.index)]
        if len(finite):
            # a small sideways shift so overlapping error bars of different methods stay apart
            shift = 2.0 ** (0.03 * (private.index(method) - (len(private) - 1) / 2))
            several = finite["count"] > 1
            ax.errorbar(finite.index.to_numpy(float) * shift, finite["mean"],
                        yerr=finite["std"].where(several, 0.0) if several.any() else None,
                        linestyle=line if len(finite) > 1 else "none", marker=marker, color=grey, markersize=5,
                        capsize=3, label=label)
        for _, reference in rows[~np.isfinite(rows.index)].iterrows():
            ax.axhline(reference["mean"], linestyle="--", color=grey, linewidth=1.2, label=f"{label} (ε = ∞)")
            if reference["count"] > 1:
                ax.axhspan(reference["mean"] - reference["std"], reference["mean"] + reference["std"], color=grey,
                           alpha=0.12, linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, labels=[f"{e:g}" for e in budgets])
    ax.xaxis.set_minor_locator(NullLocator())
    if len(budgets) == 1:
        ax.set_xlim(budgets[0] / 2, budgets[0] * 2)
    ax.set_xlabel("privacy budget ε")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_sharpness_drift(curvature: pd.DataFrame, drift: pd.DataFrame, out, title: str) -> None:
    """Fig. 3: (a) the sharpness proxy Sharp_t(w_t; rho) averaged over tasks and (b) the reference drift
    mean_t ||w_t - w0|| / ||w0|| against the privacy budget, one line per method, mean +- std over seeds; the
    non-private runs (infinite epsilon) as dashed horizontal references. `out`: one path or several."""
    _require(curvature, {"method", "target_epsilon", "seed", "task", "sharpness"}, "curvature")
    _require(drift, {"method", "target_epsilon", "seed", "mean_drift"}, "drift")
    _one_value(curvature, "backbone", "curvature")
    _one_value(drift, "backbone", "drift")
    # Curvature files name the diagnostic's radius sharpness_rho (older ones: rho, which newer files use for the
    # fine-tuning's SAM radius)
    radius_column = "sharpness_rho" if "sharpness_rho" in curvature.columns else "rho"
    _one_value(curvature, radius_column, "curvature (the sharpness radius)")
    keys = ["method", "epsilon", "seed"]
    curvature = curvature.assign(epsilon=curvature["target_epsilon"].map(epsilon_value))
    drift = drift.assign(epsilon=drift["target_epsilon"].map(epsilon_value))
    # Sharp_t(w_t) does not depend on the merge: one value per task model, then each seed's average over tasks
    sharpness = (curvature.groupby(keys + ["task"], dropna=False)["sharpness"].mean()
                 .groupby(level=keys, dropna=False).mean())
    drifts = drift.groupby(keys, dropna=False)["mean_drift"].mean()
    radii = curvature[radius_column].dropna() if radius_column in curvature.columns else pd.Series(dtype=float)
    radius = f" (ρ = {radii.iloc[0]:g})" if len(radii) else ""

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    try:
        _epsilon_panel(axes[0], sharpness, r"sharpness proxy $\mathrm{Sharp}_t(w_t;\rho)$ (nats)")
        axes[0].set_title(f"(a) average sharpness over tasks{radius}", fontsize=9)
        _epsilon_panel(axes[1], drifts, r"reference drift $\Vert w_t - w_0\Vert / \Vert w_0\Vert$ (ratio)")
        axes[1].set_title("(b) reference drift, mean over tasks", fontsize=9)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        _save_all(fig, out)
    finally:
        plt.close(fig)


def _gap_panel(ax, methods: pd.Series, x: np.ndarray, y: np.ndarray, xlabel: str, ratio: str) -> None:
    """Measured gap (y) against a prediction (x) on log-log axes with y = x. Values <= 0 cannot sit on a log axis:
    they are drawn hollow at a floor a decade below the smallest positive value, and counted in the legend;
    rows with a non-finite value are counted there too."""
    finite = np.isfinite(x) & np.isfinite(y)
    positive = np.concatenate([x[finite & (x > 0)], y[finite & (y > 0)]])
    floor = 10.0 ** (np.floor(np.log10(positive.min())) - 1) if positive.size else 1e-6
    xs, ys = np.where(x > 0, x, floor), np.where(y > 0, y, floor)
    clipped = finite & ((x <= 0) | (y <= 0))
    for index, method in enumerate(_methods(methods.to_frame("method"))):
        _, marker, grey = _style(method, index)
        sel = finite & (methods == method).to_numpy()
        ax.scatter(xs[sel & ~clipped], ys[sel & ~clipped], marker=marker, s=28, facecolors=grey,
                   edgecolors="black", linewidths=0.5, label=METHOD_LABELS.get(method, method))
        if (sel & clipped).any():
            ax.scatter(xs[sel & clipped], ys[sel & clipped], marker=marker, s=28, facecolors="none",
                       edgecolors="black", linewidths=0.8)
    if clipped.any():
        ax.scatter([], [], marker="o", s=28, facecolors="none", edgecolors="black",
                   label=f"hollow: value ≤ 0, drawn at {floor:.0e} (n = {int(clipped.sum())})")
        if (finite & (y <= 0)).any():
            ax.axhline(floor, linestyle=":", color="0.5", linewidth=0.8)
        if (finite & (x <= 0)).any():
            ax.axvline(floor, linestyle=":", color="0.5", linewidth=0.8)
    notes = []
    if finite.any():
        low, high = min(xs[finite].min(), ys[finite].min()), max(xs[finite].max(), ys[finite].max())
        ax.plot([low, high], [low, high], color="black", linewidth=0.9, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        notes.append("no row has finite values")
    if (both := finite & (x > 0) & (y > 0)).any():
        notes.append(f"median {ratio} = {np.median(x[both] / y[both]):.2g}")
    if (~finite).any():
        count = int((~finite).sum())
        notes.append(f"{count} row{'s' if count > 1 else ''} with a non-finite value not shown")
    for note in notes:  # legend lines without a mark, so they never cover the points
        ax.plot([], [], linestyle="none", label=note)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(r"measured merge gap $\mathcal{L}_t(w_\mathrm{merge}) - \mathcal{L}_t(w_t)$ (nats)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")


def plot_gap_vs_bound(curvature: pd.DataFrame, out, title: str) -> None:
    """Merge gap per task against (a) Theorem 5.2's bound ||grad L_t(w_t)|| ||Delta_t|| + beta_t/2 ||Delta_t||^2
    and (b) Eq. (3)'s second-order estimate 1/2 lambda_max(H_t) ||w_merge - w_t||^2, markers per method, log-log
    with y = x. `out`: one path or several."""
    _require(curvature, {"method", "merge_gap", "bound", "lambda_max_at_task", "displacement"}, "curvature")
    gap = curvature["merge_gap"].to_numpy(float)
    bound = curvature["bound"].to_numpy(float)
    estimate = 0.5 * curvature["lambda_max_at_task"].to_numpy(float) * curvature["displacement"].to_numpy(float) ** 2
    methods = curvature["method"].reset_index(drop=True)

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    try:
        _gap_panel(axes[0], methods, bound, gap, "Theorem 5.2 bound on the merge gap (nats)", "bound / gap")
        axes[0].set_title("(a) merge gap vs Theorem 5.2 bound", fontsize=9)
        _gap_panel(axes[1], methods, estimate, gap,
                   r"Eq. (3) estimate $\frac{1}{2}\lambda_{\max}(H_t)\,\Vert w_\mathrm{merge} - w_t\Vert^2$ (nats)",
                   "estimate / gap")
        axes[1].set_title("(b) merge gap vs second-order estimate", fontsize=9)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        _save_all(fig, out)
    finally:
        plt.close(fig)


def _epsilon_text(target_epsilon) -> str:
    eps = epsilon_value(target_epsilon)
    return rf"$\varepsilon$ = {eps:g}" if np.isfinite(eps) else r"non-private ($\varepsilon = \infty$)"


def _landscape_axis_label(first: pd.Series, axis: int) -> str:
    coordinate = "ab"[axis - 1]
    if first.get("plane") == "task_vectors":
        task = first.get(f"direction_{axis}", f"task {axis}")
        return rf"{coordinate} (multiples of $\tau$ of {task})"
    return f"{coordinate} (direction {axis}, filter-normalised units)"


def plot_landscape(frames: list[pd.DataFrame], out: str | Path, title: str) -> None:
    """Figs. 4, 5 (paper App. B.4): contours of the merged model's mean test loss over the plane (a, b) of a
    `dpmerge landscape` file, one panel per file (one method and merge operator), the merged model at (0, 0).

    Every panel uses the same contour levels and grey scale, so the width of the low-loss region around the
    merged model, the paper's comparison of naive DP with DP-Merging, can be read across panels."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    plt = _pyplot()
    if not frames:
        raise ValueError("plot_landscape needs at least one landscape file")
    surfaces = []
    for frame in frames:
        mean = frame[frame["task"] == "mean"]
        if mean.empty:
            raise ValueError("a landscape has no rows of task 'mean' (is it from 'dpmerge landscape'?)")
        # several seeds of one method in one file are averaged point by point
        surfaces.append((frame.iloc[0], mean.pivot_table(index="b", columns="a", values="loss", aggfunc="mean")))
    low = min(float(np.nanmin(surface.to_numpy())) for _, surface in surfaces)
    high = max(float(np.nanmax(surface.to_numpy())) for _, surface in surfaces)
    if not high > low:  # a flat landscape still needs increasing levels
        high = low + max(abs(low), 1.0) * 1e-6
    # Loss grows about quadratically away from a minimum, so levels spaced quadratically in loss fall about evenly
    # in distance on the plane instead of crowding into the steep rim
    levels = low + (high - low) * np.linspace(0.0, 1.0, 13) ** 2
    # Light = low loss; the darkest grey stops short of black so the black contour lines stay visible on it
    greys = ListedColormap(plt.get_cmap("Greys")(np.linspace(0.05, 0.75, 256)))
    norm = BoundaryNorm(levels, greys.N)

    cols = min(3, len(frames))
    rows = int(np.ceil(len(frames) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.6 * rows), squeeze=False, constrained_layout=True)
    for ax, (first, surface) in zip(axes.flat, surfaces):
        a, b = surface.columns.to_numpy(float), surface.index.to_numpy(float)
        filled = ax.contourf(a, b, surface.to_numpy(float), levels=levels, cmap=greys, norm=norm)
        lines = ax.contour(a, b, surface.to_numpy(float), levels=levels, colors="black", linewidths=0.6)
        ax.clabel(lines, fmt="%.3g", fontsize=6)
        ax.plot(0.0, 0.0, linestyle="none", marker="*", markersize=11, markerfacecolor="white",
                markeredgecolor="black", label="merged model")
        method, operator = str(first.get("method", "")), str(first.get("operator", ""))
        label = f"{METHOD_LABELS.get(method, method)} + {operator_label(operator)}"
        details = ", ".join(part for part in (
            str(first["backbone"]) if "backbone" in first else "",
            _epsilon_text(first["target_epsilon"]) if "target_epsilon" in first else "",
        ) if part)
        ax.set_title(label + (f"\n{details}" if details else ""), fontsize=9)
        ax.set_xlabel(_landscape_axis_label(first, 1), fontsize=8)
        ax.set_ylabel(_landscape_axis_label(first, 2), fontsize=8)
        ax.set_aspect("equal", adjustable="box")
    for ax in list(axes.flat)[len(frames):]:
        ax.set_visible(False)
    axes.flat[0].legend(loc="upper right", fontsize=7)
    fig.colorbar(filled, ax=list(axes.flat)[:len(frames)], shrink=0.9,
                 label="mean test loss over tasks (cross-entropy, nats)")
    if title:
        fig.suptitle(title, fontsize=10)
    _save_all(fig, out)
    plt.close(fig)
