"""The study's answer on one page: does DP-Merging merge better than naive DP, per backbone and operator, with
the ablation, read from the Table 1 files that ran, and the privacy ledger's verdict.

Written as Markdown (results/answer.md) and as reStructuredText that Snakemake's report opens on (the Snakefile
uses it as the report's front page once it exists).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pandas as pd

from dpmerge.artifacts import atomic_write
from dpmerge.methods import ABLATIONS, METHODS, PRIVATE_MERGED_METHODS
from dpmerge.report import forest
from dpmerge.report import signal_check as signal
from dpmerge.report.labels import AVERAGE, AVERAGE_GAIN, METHOD_LABELS
from dpmerge.report.tables import INTERVAL_NOTE, PRETRAINED_ROW, signed_cell

COMPARED = (("dp_merging", "DP-Merging − DP"), ("dp_sam", "w/o alignment − DP (DP-SAM, no anchor)"),
            ("dp_anchor", "w/o flatness − DP (anchor, no SAM)"))
# The ablations' and DPSAT's columns appear where their runs are in Table 1 (the demo runs neither): a column
# that no study filled would read as a result missing
OPTIONAL = COMPARED[1:] + (("dp_sat", "DPSAT − DP (one query)"),
                           ("dp_sat_anchor", "DPSAT + anchor − DP (one query)"))
# any other ablation in methods.py gets a column under its label
OPTIONAL += tuple((m, f"{METHODS[m].label} − DP") for m in ABLATIONS if m not in dict(OPTIONAL))


def compared_methods(tables: dict[str, pd.DataFrame]) -> tuple[tuple[str, str], ...]:
    """The methods set against DP on the page: DP-Merging always, then each ablation and DPSAT where any table
    holds its rows."""
    present = [(method, label) for method, label in OPTIONAL
               if any(table["row"].astype(str).str.startswith(f"{METHOD_LABELS[method]} + ").any()
                      for table in tables.values())]
    return COMPARED[:1] + tuple(present)


def header(compared) -> list[str]:
    return ["Backbone", "Operator", "Pretrained", "DP + operator", *[label for _, label in compared],
            "Non-private + operator"]


HEADER = header(COMPARED)


def _row(table: pd.DataFrame, label: str) -> pd.Series | None:
    found = table[table["row"] == label]
    return None if found.empty else found.iloc[0]


def _gain(row: pd.Series | None) -> tuple[str, float | None, float | None]:
    if row is None or pd.isna(row.get(AVERAGE_GAIN)):
        return "", None, None
    low, high = row.get(f"{AVERAGE_GAIN} ci95 low"), row.get(f"{AVERAGE_GAIN} ci95 high")
    return signed_cell(row[AVERAGE_GAIN], low, high), low, high


def _score(row: pd.Series | None) -> str:
    return "" if row is None or pd.isna(row.get(AVERAGE)) else f"{row[AVERAGE]:.1f}"


def operators_in(table: pd.DataFrame) -> list[str]:
    """The merge labels Table 1 holds, in its order (rows 'DP + <merge>')."""
    prefix = f"{METHOD_LABELS['naive_dp']} + "
    return [row[len(prefix):] for row in table["row"] if str(row).startswith(prefix)]


# The verdicts privacy/ledger.ledger_check writes (report may not import privacy; tests/test_answer.py holds the
# two spellings together).
LEDGER_VERDICTS = ("PASS", "FAIL")


def ledger_verdict(check_path: str | Path) -> str:
    """PASS or FAIL, as the ledger's check file (privacy/ledger_check.json) says; anything else is refused."""
    try:
        verdict = json.loads(Path(check_path).read_text()).get("verdict")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"{check_path}: not a ledger check file ('dpmerge ledger --check-out'): {error}") from None
    if verdict not in LEDGER_VERDICTS:
        raise ValueError(f"{check_path}: field 'verdict' must be one of {', '.join(LEDGER_VERDICTS)}, got {verdict!r}")
    return verdict


def answer_rows(tables: dict[str, pd.DataFrame], compared=COMPARED) -> tuple[list[list[str]], list[str], set[int]]:
    """Table rows (one cell per `compared` method), one summary line per setting, and the seed counts behind the
    cells."""
    rows, summary, seeds = [], [], set()
    for setting, table in tables.items():
        better = worse = total = positive = intervals = 0
        for operator in operators_in(table):
            cells = [setting, operator, _score(_row(table, PRETRAINED_ROW))]
            dp = _row(table, f"{METHOD_LABELS['naive_dp']} + {operator}")
            cells.append(_score(dp))
            for method, _ in compared:
                row = _row(table, f"{METHOD_LABELS[method]} + {operator}")
                text, low, high = _gain(row)
                cells.append(text)
                if row is not None and pd.notna(row.get("seeds")):
                    seeds.add(int(row["seeds"]))
                if method == "dp_merging" and text:
                    total += 1
                    positive += row[AVERAGE_GAIN] > 0
                    intervals += low is not None and pd.notna(low)
                    better += low is not None and low > 0
                    worse += high is not None and high < 0
            cells.append(_score(_row(table, f"{METHOD_LABELS['nonprivate']} + {operator}")))
            rows.append(cells)
        if total and intervals:
            summary.append(f"{setting}: DP-Merging − DP is above 0 with 95 % confidence under {better} of {total} "
                           f"operators and below 0 under {worse}.")
        elif total:  # one seed: point estimates only, which decide nothing
            summary.append(f"{setting}: one seed, so no intervals; DP-Merging − DP is positive under {positive} of "
                           f"{total} operators as a point estimate.")
        if line := _against_pretrained(setting, table):
            summary.append(line)
    return rows, summary, seeds


def _against_pretrained(setting: str, table: pd.DataFrame) -> str | None:
    """Whether any private merge beats w0 with DP heads (means over seeds), naming the best one."""
    pretrained = _row(table, PRETRAINED_ROW)
    if pretrained is None or pd.isna(pretrained.get(AVERAGE)):
        return None
    prefixes = tuple(f"{METHOD_LABELS[m]} + " for m in PRIVATE_MERGED_METHODS)
    merged = table[table["row"].astype(str).str.startswith(prefixes)].dropna(subset=[AVERAGE])
    if merged.empty:
        return None
    best = merged.loc[merged[AVERAGE].idxmax()]
    beating = int((merged[AVERAGE] > pretrained[AVERAGE]).sum())
    return (f"{setting}: {beating} of {len(merged)} private merges score above the Pretrained row "
            f"({pretrained[AVERAGE]:.1f}); the best is {best['row']} at {best[AVERAGE]:.1f}.")


def _markdown_table(rows: list[list[str]], names: list[str] = HEADER) -> list[str]:
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join([":---"] * 2 + ["---:"] * (len(names) - 2)) + "|"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


# The report's front page. Snakemake 9's report template (its components/content.js) sets this page's HTML in a
# 32rem text column (Tailwind's max-w-lg) of a row flex box beside the rule graph, and centres that box vertically
# in a scrolling window: a table wider than the column spilled under the graph, and a page taller than the window
# lost its top (the title) out of scrolling reach. So the table sits in a box of its own that scrolls sideways
# when it must, which overlaps nothing wherever the template puts it; and, in browsers with :has() (all current
# ones), this page widens its column, puts the graph below it and starts at the top. The <style> is part of the
# page's own HTML, so it applies only while the front page is shown. Snakemake passes the page through Jinja:
# no "{" directly before "{", "%" or "#" here.
ANSWER_BOX = "dpmerge-answer"
FRONT_PAGE_CSS = f"""\
.{ANSWER_BOX} {{ overflow-x: auto; max-width: 100%; }}
.prose:has(.{ANSWER_BOX}) {{ max-width: 72rem; }}
div:has(> #rulegraph):has(.{ANSWER_BOX}) {{ flex-direction: column; }}
div:has(> div > #rulegraph):has(.{ANSWER_BOX}) {{ align-items: flex-start; }}"""


def _rst_table(rows: list[list[str]], names: list[str] = HEADER) -> list[str]:
    lines = [f".. container:: {ANSWER_BOX}", "", "   .. list-table::", "      :header-rows: 1", ""]
    for cells in [names, *rows]:
        lines.append("      * - " + (cells[0] or " "))
        lines += [f"        - {cell or ' '}" for cell in cells[1:]]
    return lines


def _rst_style() -> list[str]:
    return [".. raw:: html", "", "   <style>", *[f"   {line}" for line in FRONT_PAGE_CSS.splitlines()],
            "   </style>", ""]


def audit_line(summary: pd.DataFrame) -> str:
    """One sentence on the audits' table (report/audit.py): how many settings, whether any bound exceeds its
    claim, and the largest private and non-private bounds with where they were measured."""
    columns = [c for c in summary.columns if c.endswith(" epsilon_lb")]
    long = summary.melt(id_vars=["backbone", "method", "target_epsilon", "claimed_epsilon"], value_vars=columns,
                        var_name="audit", value_name="epsilon_lb").dropna(subset=["epsilon_lb"])
    failed = int((summary["verdict"] == "FAIL").sum())
    verdict = f"{failed} with a bound above its claim (FAIL)" if failed else "no bound above its claim"
    parts = [f"Empirical audits (one-run, each release group's runs pooled, 95 % lower bounds on ε): "
             f"{len(summary)} settings, {verdict}"]
    for label, chosen in (("private", long[long["target_epsilon"].map(lambda e: e != float("inf"))]),
                          ("non-private", long[long["target_epsilon"] == float("inf")])):
        if len(chosen):
            top = chosen.loc[chosen["epsilon_lb"].idxmax()]
            where = top["audit"].removesuffix(" epsilon_lb").replace("_", "-")
            claim = f", claimed {top['claimed_epsilon']:.2f}" if label == "private" else ""
            parts.append(f"largest {label} bound {top['epsilon_lb']:.2f} ({where}, {top['backbone']}, "
                         f"{METHOD_LABELS.get(top['method'], top['method'])}, ε = {top['target_epsilon']:g}{claim})")
    return "; ".join(parts) + ". A lower bound says what the audit could refute, not what the run leaks at most."


def _signal_section(signal_path: str | None) -> tuple[list[str], list[str], str | None]:
    """The signal check's table as Markdown and RST lines, and its one-sentence summary."""
    if not signal_path:
        return [], [], None
    frame = pd.read_parquet(signal_path)
    wide = signal.wide_table(frame)
    names, rows = list(wide.columns), wide.astype(str).values.tolist()
    title = "Signal check: does each task's individual model beat chance?"
    note = signal.note(frame)
    markdown = [f"## {title}", "", *_markdown_table(rows, names), "", note, ""]
    rst = [title, "-" * len(title), "", *_rst_table(rows, names), "", note, ""]
    return markdown, rst, signal.summary_line(frame)


FOREST_CAPTION = ("Every cell's DP-Merging − DP (filled circles) and DP-Merging's margin over the Pretrained row "
                  "(open squares), paired by seed, with 95 % t-intervals; right of the dashed line is better for "
                  "DP-Merging.")


def _figure_section(frames: dict[str, pd.DataFrame], figure: list[str], markdown_path: str) -> tuple[list, list]:
    """Draws the forest plot into `figure` (.png and/or .pdf); the Markdown page links the PNG, the report's
    front page embeds it (the report is one self-contained file)."""
    if not figure:
        return [], []
    rows = forest.forest_rows(frames, operators_in)
    forest.plot_forest(rows, figure)  # drawn also when empty (it says so): the rule promises the file
    if rows.empty:
        return [], []
    png = next((path for path in figure if str(path).endswith(".png")), None)
    if png is None:
        return [], []
    relative = os.path.relpath(png, os.path.dirname(os.path.abspath(markdown_path)) or ".")
    # docutils refuses a line over 10,000 characters (the page then shows an error instead), so the image's
    # base64 runs over many lines: a browser drops the line breaks from a URL and the spaces from base64
    encoded = base64.encodebytes(Path(png).read_bytes()).decode().split()
    markdown = [f"![DP-Merging − DP and DP-Merging − Pretrained per cell]({relative})", "", FOREST_CAPTION, ""]
    rst = [".. raw:: html", "", '   <img alt="forest plot of every cell" style="max-width:100%" '
           'src="data:image/png;base64,', *[f"   {line}" for line in encoded], '   ">', "", FOREST_CAPTION, ""]
    return markdown, rst


def write_answer(*, tables: dict[str, str], ledger: str, out_markdown: str, out_rst: str, links: list[str],
                 description: str | None = None, audit_table: str | None = None, signal_check: str | None = None,
                 figure: list[str] | None = None) -> None:
    """`tables` maps a setting's label (e.g. 'effnet, ε = 4') to its Table 1 Parquet file; `ledger` is the
    ledger's check file (JSON); `audit_table` the audits' table (Parquet), when the study audits; `signal_check`
    the signal check's Parquet file (report/signal_check.py); `figure` where the forest plot goes."""
    frames = {setting: pd.read_parquet(path) for setting, path in tables.items()}
    compared = compared_methods(frames)
    rows, summary, seeds = answer_rows(frames, compared)
    names = header(compared)
    verdict = ledger_verdict(ledger)
    signal_markdown, signal_rst, signal_line = _signal_section(signal_check)
    if signal_line:
        summary.insert(0, signal_line)
    figure_markdown, figure_rst = _figure_section(frames, figure or [], out_markdown)
    counts = ", ".join(str(n) for n in sorted(seeds)) or "?"
    title = "Does DP-Merging merge better than naive DP?"
    intro = (f"Average test score (0-100) of the merged model over the tasks; {counts} seed(s) per cell. "
             "Pretrained: w0 unchanged with each task's own head trained under DP at the same budget (CLIP: "
             "its zero-shot heads), the score a merge must beat to be worth doing. "
             "Each difference is paired by seed (the same seed index, tasks and operator). " + INTERVAL_NOTE)
    ledger_line = ("Privacy ledger (every release's ε recomputed from its record under its neighbouring relation and "
                   f"held above an accountant-free lower bound): {verdict}.")
    audits = [audit_line(pd.read_parquet(audit_table)), ""] if audit_table else []
    markdown = [f"# {title}", "", intro, "", *_markdown_table(rows, names), "", *[f"- {s}" for s in summary], "",
                *figure_markdown, ledger_line, "", *audits, *signal_markdown,
                "Files: " + ", ".join(f"`{link}`" for link in links), ""]
    rst = [title, "=" * len(title), "", *_rst_style(), intro, "", *_rst_table(rows, names), "",
           *[f"- {s}" for s in summary], "", *figure_rst, f"**{ledger_line}**", "", *audits,
           "Every table with every task is under **Tables**, the ledger under **Privacy**, and the "
           "diagnostics' figures, where the study ran them (not the demo), under **Figures**. Files: "
           + ", ".join(f"``{link}``" for link in links), "", *signal_rst]
    if description:
        rst += ["About this workflow", "-------------------", "", Path(description).read_text()]
    atomic_write(out_markdown, lambda path: Path(path).write_text("\n".join(markdown)))
    atomic_write(out_rst, lambda path: Path(path).write_text("\n".join(rst)))
