"""Paper-shaped tables (Parquet + Markdown + LaTeX) and figures from evaluation and diagnostic files.

Table 1 (paper, Sec. 6.2) per backbone and epsilon: rows are the DP individual models and, for every merge
operator, naive DP + operator and DP-Merging + operator with the improvement; columns are the tasks and
their average, each task scored with its own metric on a 0-100 scale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.taskvectors import atomic_write

METHOD_LABELS = {
    "nonprivate": "Non-private",
    "naive_dp": "DP",
    "dp_merging": "DP-Merging",
    "dp_sam": "DP-Merging w/o alignment",
    "dp_anchor": "DP-Merging w/o flatness",
}
ABLATIONS = ("dp_sam", "dp_anchor")
OPERATOR_LABELS = {
    "weight_averaging": "Weight Averaging", "task_arithmetic": "Task Arithmetic", "ties": "TIES", "dare": "DARE",
    "pcb": "PCB", "wudi": "WUDI", "tsv_m": "TSV-M", "iso_c": "Iso-C", "iso_cts": "Iso-CTS",
    "regmean": "RegMean", "fisher": "Fisher", "consensus_ta": "Consensus TA", "emr": "EMR (per-task models)",
    "tall_masks": "TALL masks (per-task models)", "dts": "DTS-T (per-task models)",
    "dts_difference": "DTS-D (per-task models)",
}


def operator_label(name: str) -> str:
    """Label of a configured merge: the operator's, and 'ties_difference' -> 'TIES (difference vectors)'."""
    if name in OPERATOR_LABELS:
        return OPERATOR_LABELS[name]
    base, _, variant = name.rpartition("_")
    if variant == "difference" and base in OPERATOR_LABELS:
        return f"{OPERATOR_LABELS[base]} (difference vectors)"
    return name


def _label(mapping: dict, key: str) -> str:
    return mapping.get(key, key)


def table1(scores: pd.DataFrame, baseline: str = "naive_dp", proposed: str = "dp_merging") -> pd.DataFrame:
    """Table-1-shaped frame: index = row labels, columns = tasks + 'Avg.'; mean over seeds.

    Non-private reference rows (individual and per operator) and the ablations' rows (dp_sam = w/o alignment,
    dp_anchor = w/o flatness; individual and per operator) are included when such runs are present.

    `scores` has columns model ('individual' or an operator), method, task, score and, for individual
    models, source_task (the task the vector was trained on; only its own task counts as "Individual").
    """
    needed = {"model", "method", "task", "score"}
    if missing := needed - set(scores.columns):
        raise ValueError(f"score table lacks columns {sorted(missing)}")
    if "source_task" in scores.columns:
        own = (scores["model"] != "individual") | (scores["source_task"] == scores["task"])
        scores = scores[own]
    tasks = list(dict.fromkeys(scores["task"]))
    mean = scores.groupby(["model", "method", "task"], sort=False)["score"].mean().sort_index()

    def row(model: str, method: str) -> pd.Series | None:
        if (model, method) not in mean.index.droplevel("task").unique():
            return None
        values = mean.loc[(model, method)].reindex(tasks)
        return pd.concat([values, pd.Series({"Avg.": values.mean()})])

    rows: dict[str, pd.Series] = {}
    for method in ("nonprivate", baseline, proposed, *ABLATIONS):
        if (r := row("individual", method)) is not None:
            rows[f"{_label(METHOD_LABELS, method)} Individual"] = r
    operators = [m for m in dict.fromkeys(scores["model"]) if m != "individual"]
    for operator in operators:
        base, ours = row(operator, baseline), row(operator, proposed)
        op = operator_label(operator)
        if (reference := row(operator, "nonprivate")) is not None:
            rows[f"{_label(METHOD_LABELS, 'nonprivate')} + {op}"] = reference
        if base is not None:
            rows[f"{_label(METHOD_LABELS, baseline)} + {op}"] = base
        if ours is not None:
            rows[f"{_label(METHOD_LABELS, proposed)} + {op}"] = ours
        if base is not None and ours is not None:
            rows[f"  improvement ({op})"] = ours - base
        for ablation in ABLATIONS:  # paper Table 5's rows, when those runs exist
            if (r := row(operator, ablation)) is not None:
                rows[f"{_label(METHOD_LABELS, ablation)} + {op}"] = r
    table = pd.DataFrame(rows).T
    table.index.name = "row"
    return table


def to_markdown(table: pd.DataFrame, caption: str = "") -> str:
    header = [table.index.name or ""] + [str(c) for c in table.columns]
    lines = ([f"{caption}", ""] if caption else []) + [
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":---"] + ["---:"] * len(table.columns)) + "|",
    ]
    for label, values in table.iterrows():
        cells = ["" if pd.isna(v) else f"{v:.1f}" for v in values]
        lines.append("| " + " | ".join([str(label).strip()] + cells) + " |")
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
        text = text.replace(char, escaped)
    return text


def to_latex(table: pd.DataFrame, caption: str = "", label: str = "") -> str:
    """booktabs tabular; improvement rows in italics."""
    cols = "l" + "r" * len(table.columns)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    if label:
        lines.append(rf"\label{{{label}}}")
    lines += [rf"\begin{{tabular}}{{{cols}}}", r"\toprule"]
    lines.append(" & ".join(["Method"] + [_latex_escape(str(c)) for c in table.columns]) + r" \\")
    lines.append(r"\midrule")
    for name, values in table.iterrows():
        name = str(name)
        italic = name.strip().startswith("improvement")
        cells = ["--" if pd.isna(v) else (f"{v:+.1f}" if italic else f"{v:.1f}") for v in values]
        if italic:
            cells = [rf"\textit{{{c}}}" for c in cells]
        lines.append(" & ".join([_latex_escape(name.strip())] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, prefix: str | Path, caption: str) -> list[Path]:
    """Write <prefix>.parquet, .md and .tex (atomically) and return their paths."""
    prefix = Path(prefix)
    paths = [prefix.with_suffix(".parquet"), prefix.with_suffix(".md"), prefix.with_suffix(".tex")]
    atomic_write(paths[0], lambda tmp: table.reset_index().to_parquet(tmp, index=False))
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text(to_markdown(table, caption)))
    atomic_write(paths[2], lambda tmp: Path(tmp).write_text(to_latex(table, caption, f"tab:{prefix.name}")))
    return paths


def plot_interpolation(curves: pd.DataFrame, out: str | Path, title: str) -> None:
    """Fig. 2: test loss along (1-gamma) w_t + gamma w_merge, one panel per task, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(curves["task"]))
    methods = list(dict.fromkeys(curves["method"]))
    styles = [("-", "o", "0.0"), ("--", "s", "0.45"), (":", "^", "0.25"), ("-.", "d", "0.6")]
    cols = min(4, len(tasks))
    rows = int(np.ceil(len(tasks) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for (line, marker, grey), method in zip(styles, methods):
            sel = curves[(curves["task"] == task) & (curves["method"] == method)]
            sel = sel.groupby("gamma", as_index=False)["loss"].mean()
            ax.plot(sel["gamma"], sel["loss"], linestyle=line, marker=marker, color=grey, markersize=3,
                    label=_label(METHOD_LABELS, method))
        ax.set_title(task, fontsize=9)
        ax.set_xlabel(r"$\gamma$ (0 = task model, 1 = merged)")
        ax.set_ylabel("test loss (cross-entropy, nats)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=120, format=out.suffix.lstrip(".")))
    plt.close(fig)
