"""One writer for the study's small result tables (mixing, effective noise, audits): numeric Parquet for analysis,
Markdown for the README and report, booktabs LaTeX for a paper, from the same rows and cell formatting."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from dpmerge.artifacts import atomic_write
from dpmerge.report.tables import signed_cell

_TEX_ESCAPES = {"%": r"\%", "_": r"\_", "−": "$-$", "×": r"$\times$", "ε": r"$\varepsilon$"}


def interval_cell(mean: float, low: float, high: float, digits: int = 1, signed: bool = False) -> str:
    """'56.0 [53.5, 58.5]' ('–' for no value, no interval below two seeds); a signed difference as the paper tables
    write it (tables.signed_cell). Minus signs typeset as '−'."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if signed:
        return signed_cell(mean, low, high).replace("-", "−")
    text = f"{mean:.{digits}f}"
    if not (isinstance(low, float) and math.isnan(low)):
        text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text.replace("-", "−")


def epsilon_text(epsilon: float) -> str:
    return "∞" if not np.isfinite(epsilon) else f"{epsilon:g}"


def tex_escape(text: str) -> str:
    for char, escaped in _TEX_ESCAPES.items():
        text = text.replace(char, escaped)
    return text


def write_small_table(summary: pd.DataFrame, prefix: str, caption: str, headers: dict[str, str],
                      cell: Callable[[str, pd.Series], str], text_columns: int = 2,
                      markdown_after: list[str] = ()) -> list[Path]:
    """<prefix>.parquet (every column of `summary`), .md and .tex (the `headers` columns, each cell formatted by
    `cell(column, row)`; the first `text_columns` left-aligned). `markdown_after`: lines appended to the .md."""
    paths = [Path(prefix + ext) for ext in (".parquet", ".md", ".tex")]
    atomic_write(paths[0], lambda tmp: summary.to_parquet(tmp, index=False))
    columns = list(headers)
    lines = [caption, "", "| " + " | ".join(headers.values()) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(c, row) for c in columns) + " |" for _, row in summary.iterrows()]
    lines += list(markdown_after)
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    body = [r"\begin{table}[t]", r"\centering", rf"\caption{{{tex_escape(caption)}}}",
            r"\begin{tabular}{" + "l" * text_columns + "r" * (len(columns) - text_columns) + "}", r"\toprule",
            " & ".join(tex_escape(h) for h in headers.values()) + r" \\", r"\midrule"]
    body += [" & ".join(tex_escape(cell(c, row)) for c in columns) + r" \\" for _, row in summary.iterrows()]
    body += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    atomic_write(paths[2], lambda tmp: Path(tmp).write_text("\n".join(body) + "\n"))
    return paths
