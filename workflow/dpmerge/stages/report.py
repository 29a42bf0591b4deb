"""The paper's tables and figures from the stages' Parquet outputs. Rules (paper.smk): table1, table4-table8
(`table`), figure_interpolation, figure_sharpness_drift, figure_gap_bound and figure_landscape (the plot
commands).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpmerge.report import ace_study, figures
from dpmerge.report import signal_check as signal
from dpmerge.report import tables as paper_tables
from dpmerge.report.answer import write_answer
from dpmerge.report.protocol import write_choice
from dpmerge.stages.common import log, recorded_paths


def _read_all(paths: list[str]):
    """The score (or diagnostic) files, one frame. A folder is refused: pandas would read every Parquet file
    under it as one dataset, whatever they hold."""
    for path in paths:
        if Path(path).is_dir():
            raise ValueError(f"{path} is a folder; give the .parquet files themselves (e.g. {path}/*.parquet)")
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such file")
    return pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)


def table(*, kind: str, scores: list[str], out_prefix: str, caption: str = "", operator: str = "ties",
          metric_in_header: bool = False) -> None:
    """A paper table from evaluation files, written as PREFIX.parquet, .md, .tex and .html. `kind`: multitask
    (Tables 1-3), epsilon_sweep (4), ablation (5), rho (6), anchor_lambda (7) or operators (8)."""
    frame = _read_all(scores)
    if metric_in_header and kind != "multitask":
        raise ValueError("--metric-in-header applies to --kind multitask only")
    try:
        if kind == "multitask":
            result = paper_tables.table1(frame, metric_in_header=metric_in_header)
        elif kind == "epsilon_sweep":
            result = paper_tables.table_epsilon_sweep(frame, operator=operator)
        elif kind == "ablation":
            result = paper_tables.table_ablation(frame)
        elif kind in ("rho", "anchor_lambda"):
            result = paper_tables.table_sensitivity(frame, kind, operator=operator)
        else:
            result = paper_tables.table_operators(frame)
    except ValueError as error:
        raise ValueError(f"{kind} table from {len(scores)} score files: {error}") from None
    for path in paper_tables.write_table(result, out_prefix, caption):
        log(f"[table] wrote {path}")


def plot_sharpness_drift(*, curvature: list[str], drift: list[str], out: list[str], title: str = "") -> None:
    figures.plot_sharpness_drift(_read_all(curvature), _read_all(drift), out, title)
    log(f"[figure] wrote {', '.join(out)}")


def plot_gap_bound(*, curvature: list[str], out: list[str], title: str = "") -> None:
    figures.plot_gap_vs_bound(_read_all(curvature), out, title)
    log(f"[figure] wrote {', '.join(out)}")


def plot_interpolation(*, curves: list[str], out: list[str], title: str = "") -> None:
    figures.plot_interpolation(_read_all(curves), out, title)  # drawn once, saved in every format asked for
    log(f"[figure] wrote {', '.join(out)}")


def plot_landscape(*, landscapes: list[str], out: list[str], title: str = "") -> None:
    frames = [pd.read_parquet(p) for p in landscapes]
    for path in out:
        figures.plot_landscape(frames, path, title)
        log(f"[figure] wrote {path}")


def answer(*, tables: dict[str, str], ledger: str, out_markdown: str, out_rst: str, links: list[str],
           description: str | None = None, audit_table: str | None = None, signal_check: str | None = None,
           figure: list[str] | None = None) -> None:
    # the page names its files relative to the results folder, never by this machine's absolute paths
    links = recorded_paths(links, [out_markdown, out_rst]) if links else []
    write_answer(tables=tables, ledger=ledger, out_markdown=out_markdown, out_rst=out_rst, links=links,
                 description=description, audit_table=audit_table, signal_check=signal_check, figure=figure)
    log(f"[answer] wrote {out_markdown} and {out_rst}")


def signal_check(*, scores: list[str], out_prefix: str, nonprivate_share: float = signal.NONPRIVATE_SHARE,
                 private_share: float = signal.PRIVATE_SHARE) -> None:
    for name, share in (("--nonprivate-share", nonprivate_share), ("--private-share", private_share)):
        if not 0 <= share <= 1:
            raise ValueError(f"{name} must lie in [0, 1] (a share of the way from chance to 100), got {share}")
    frame = signal.signal_rows(_read_all(scores), nonprivate_share=nonprivate_share, private_share=private_share)
    for path in signal.write_signal_check(frame, out_prefix):
        log(f"[signal-check] wrote {path}")
    log(f"[signal-check] {signal.summary_line(frame)}")


def select_budget(*, candidates: dict, tables: dict[str, str], seeds: int, out_markdown: str,
                  out_parquet: str, signal_check: str | None = None) -> None:
    if missing := sorted(set(tables) - set(candidates)):
        raise ValueError(f"--table1 names candidates that --candidates does not describe: {missing}")
    frame = write_choice(candidates=candidates, tables=tables, out_markdown=out_markdown, out_parquet=out_parquet,
                         seeds=seeds, signal_check=signal_check)
    for _, row in frame[frame["chosen"]].iterrows():
        log(f"[select-budget] {row['kind']}: {row['candidate']} (pooled validation average {row['pooled']:.1f})")


def ace_report(*, gates: list[str], scores: list[str], operators: list[str], labels: dict, out_prefix: str,
               figure: list[str]) -> None:
    """ACE under DP: PREFIX_gates.* (ACE's gate and the noise floor per backbone, method and budget, from
    'dpmerge ace-gates' files), PREFIX_scores.* (each of `operators`' merged score per budget, DP-Merging - DP
    paired by seed) and the figure of both."""
    if not gates or not scores:
        raise ValueError("ace-report needs --gates and --scores files")
    gate_rows = ace_study.gate_summary(_read_all(gates))
    score_rows = ace_study.score_summary(_read_all(scores), operators)
    ace_study.write_tables(gate_rows, score_rows, labels, out_prefix)
    ace_study.plot_ace_study(gate_rows, score_rows, labels, figure)
    log(f"[ace-report] {len(gate_rows)} gate rows, {len(score_rows)} score rows -> {out_prefix}_gates.md, "
        f"{out_prefix}_scores.md")
