"""The audit table and figure: what the one-run audits (stages/audit.py) measured against what was claimed.

Table (one row per backbone, method and target epsilon): the accountant's epsilon at the audit's delta, and the
largest lower bound over the tasks (and seeds) for each audit kind, on the individual models and on the merged
ones. Figure: every bound against its claim, with the diagonal a bound may never cross.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dpmerge.artifacts import atomic_write

KIND_LABELS = {"white_box": "white-box (Dirac gradients)", "black_box": "black-box (mislabeled examples)"}


def audit_summary(audits: pd.DataFrame) -> pd.DataFrame:
    """One row per (backbone, method, target epsilon), from the audit ledger (privacy/audit_ledger.py): whole
    audits only (group "all"); `group_summary` has the groups."""
    audits = audits[audits["group"] == "all"]
    rows = []
    for (backbone, method, target), group in audits.groupby(["backbone", "method", "target_epsilon"], dropna=False,
                                                             sort=True):
        row = {"backbone": backbone, "method": method, "target_epsilon": float(target),
               "audit_delta": float(group["audit_delta"].max()),
               "claimed_epsilon": float(group["recomputed_claim"].max()), "audits": int(len(group))}
        for kind in KIND_LABELS:
            for model in ("individual", "merged"):
                chosen = group[(group["audit"] == kind) & (group["model"] == model)]
                row[f"{kind} {model} epsilon_lb"] = float(chosen["epsilon_lb"].max()) if len(chosen) else math.nan
        row["verdict"] = "FAIL" if (group["epsilon_lb"] > group["recomputed_claim"]).any() else "PASS"
        rows.append(row)
    return pd.DataFrame(rows)


def group_summary(audits: pd.DataFrame) -> pd.DataFrame:
    """Every audit that was split by groups of classes: one row per (audit, group), the whole audit first."""
    split = audits[audits["group"] != "all"]
    if not len(split):
        return pd.DataFrame()
    keys = ["path", "backbone", "task", "method", "target_epsilon", "audit"]
    chosen = audits.merge(split[keys].drop_duplicates(), on=keys)
    return chosen[keys[1:] + ["group", "canaries", "correct", "guesses", "epsilon_lb", "recomputed_claim"]]


def _cell(value) -> str:
    if isinstance(value, float):
        return "--" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.2f}")
    return str(value)


HEADERS = {"backbone": "backbone", "method": "method", "target_epsilon": "target eps",
           "claimed_epsilon": "claimed eps at audit delta", "white_box individual epsilon_lb": "white-box eps_lb",
           "black_box individual epsilon_lb": "black-box eps_lb", "white_box merged epsilon_lb":
           "white-box eps_lb, merged", "black_box merged epsilon_lb": "black-box eps_lb, merged",
           "audits": "audits", "verdict": "verdict"}


def write_audit_table(summary: pd.DataFrame, prefix: str, caption: str, groups: pd.DataFrame | None = None
                      ) -> list[Path]:
    """<prefix>.parquet (numeric columns), .md (with the groups' bounds, if any) and .tex (booktabs)."""
    paths = [Path(prefix + ext) for ext in (".parquet", ".md", ".tex")]
    atomic_write(paths[0], lambda tmp: summary.to_parquet(tmp, index=False))
    columns = [c for c in HEADERS if c in summary.columns]
    lines = [caption, "", "| " + " | ".join(HEADERS[c] for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for _, row in summary.iterrows()]
    if groups is not None and len(groups):
        lines += ["", "By group of classes (each group's canaries alone: fewer canaries, less power):", "",
                  "| backbone | task | method | target eps | audit | group | canaries | correct / guesses | eps_lb |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r.backbone} | {r.task} | {r.method} | {_cell(float(r.target_epsilon))} | {r.audit} | {r.group} "
                  f"| {r.canaries} | {r.correct} / {r.guesses} | {_cell(float(r.epsilon_lb))} |"
                  for r in groups.itertuples()]
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    escaped = caption.replace("%", r"\%").replace("_", r"\_")
    tex = [r"\begin{table}[t]", r"\centering", rf"\caption{{{escaped}}}",
           r"\begin{tabular}{" + "l" * 2 + "r" * (len(columns) - 2) + "}", r"\toprule",
           " & ".join(HEADERS[c].replace("_", r"\_") for c in columns) + r" \\", r"\midrule"]
    tex += [" & ".join(_cell(row[c]).replace("_", r"\_") for c in columns) + r" \\" for _, row in summary.iterrows()]
    tex += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    atomic_write(paths[2], lambda tmp: Path(tmp).write_text("\n".join(tex) + "\n"))
    return paths


def plot_audit(audits: pd.DataFrame, out: list[str], title: str) -> None:
    """Each audited model's bound against its claim; a non-private run (claim infinite) at the right edge."""
    from dpmerge.report.figures import _pyplot, _save_all

    plt = _pyplot()
    finite = audits["recomputed_claim"][audits["recomputed_claim"].map(math.isfinite)]
    top = max([float(finite.max()) if len(finite) else 1.0, float(audits["epsilon_lb"].max()), 1.0]) * 1.15
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    ax.plot([0, top], [0, top], color="0.5", linewidth=1, label="bound = claim (never above)")
    markers = {("white_box", "individual"): ("o", "0.1"), ("white_box", "merged"): ("s", "0.45"),
               ("black_box", "individual"): ("^", "0.1"), ("black_box", "merged"): ("v", "0.45")}
    for (kind, model), (marker, grey) in markers.items():
        chosen = audits[(audits["audit"] == kind) & (audits["model"] == model)]
        if not len(chosen):
            continue
        x = chosen["recomputed_claim"].map(lambda c: top if not math.isfinite(c) else c)
        ax.scatter(x, chosen["epsilon_lb"], marker=marker, color=grey, facecolors="none" if model == "merged" else grey,
                   label=f"{KIND_LABELS[kind]}, {model}")
    ax.axvline(top, color="0.8", linestyle=":", linewidth=1)
    ax.text(top, top * 0.55, "non-private runs (claim infinite)", fontsize=7, ha="right", va="center",
            rotation=90, color="0.4")
    ax.set(xlim=(0, top * 1.02), ylim=(0, top * 1.02), xlabel="claimed epsilon at the audit's delta",
           ylabel="audit's lower bound on epsilon (95 %)", title=title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    _save_all(fig, out)
    plt.close(fig)

