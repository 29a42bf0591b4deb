"""The audit table and figure: what the one-run audits (stages/audit.py) measured against what was claimed.

Table (one row per backbone, method and target epsilon): the accountant's epsilon at the audit's delta, and for
each audit kind the bound of the release group's pooled audit (every task's and seed's canaries in one bound,
`dpmerge audit-pool`), on the individual models and on the merged ones. A setting audited by one run alone shows
that run's bound; several runs without their pool show none, since the largest of several 95 % bounds is not a
95 % bound. Figure: every bound against its claim, pooled ones marked, with the diagonal a bound may never cross.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dpmerge.report.figures import _pyplot, _save_all
from dpmerge.report.small_table import write_small_table

KIND_LABELS = {"white_box": "white-box (Dirac gradients)", "black_box": "black-box (mislabeled examples)"}
MODELS = ("individual", "merged")


def _pooled_or_single(chosen: pd.DataFrame) -> pd.Series | None:
    """The pooled audit's row (the largest over merge operators), or the one run's when there is a single run."""
    pooled = chosen[chosen["pooled_runs"].notna()]
    if len(pooled):
        return pooled.loc[pooled["epsilon_lb"].idxmax()]
    return chosen.iloc[0] if len(chosen) == 1 else None


def audit_summary(audits: pd.DataFrame) -> pd.DataFrame:
    """One row per (backbone, method, target epsilon), from the audit ledger (privacy/audit_ledger.py): the pooled
    bounds of whole audits (group "all"), their canaries and membership AUC; `group_summary` has the groups."""
    rows = []
    for (backbone, method, target), setting in audits.groupby(["backbone", "method", "target_epsilon"],
                                                              dropna=False, sort=True):
        whole = setting[setting["group"] == "all"]
        runs = whole[whole["pooled_runs"].isna()]
        row = {"backbone": backbone, "method": method, "target_epsilon": float(target),
               "audit_delta": float(whole["audit_delta"].max()),
               "claimed_epsilon": float(whole["recomputed_claim"].max()),
               "runs": int(((runs["model"] == "individual")).sum())}
        for kind in KIND_LABELS:
            for model in MODELS:
                found = _pooled_or_single(whole[(whole["audit"] == kind) & (whole["model"] == model)])
                for field in ("epsilon_lb", "canaries", "auc", "auc_low", "auc_high"):
                    row[f"{kind} {model} {field}"] = math.nan if found is None else float(found[field])
        row["verdict"] = "FAIL" if (setting["epsilon_lb"] > setting["recomputed_claim"]).any() else "PASS"
        rows.append(row)
    return pd.DataFrame(rows)


def group_summary(audits: pd.DataFrame) -> pd.DataFrame:
    """Every audit that was split by groups of classes: one row per (audit, group), the whole audit first, with
    each group's membership AUC and its difference from the other classes'."""
    split = audits[audits["group"] != "all"]
    if not len(split):
        return pd.DataFrame()
    keys = ["path", "backbone", "task", "method", "target_epsilon", "seed", "audit"]
    chosen = audits.merge(split[keys].drop_duplicates(), on=keys)
    return chosen[keys[1:] + ["group", "canaries", "correct", "guesses", "epsilon_lb", "recomputed_claim", "auc",
                              "auc_low", "auc_high", "auc_minus_rest", "auc_minus_rest_low", "auc_minus_rest_high"]]


def _cell(value) -> str:
    if isinstance(value, float):
        return "--" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.2f}")
    return str(value)


HEADERS = {"backbone": "backbone", "method": "method", "target_epsilon": "target eps",
           "claimed_epsilon": "claimed eps at audit delta",
           **{f"{kind} {model} epsilon_lb": f"{kind.replace('_', '-')} eps_lb{', merged' if model == 'merged' else ''}"
              for kind in KIND_LABELS for model in MODELS},
           "runs": "audit runs", "verdict": "verdict"}


def _interval(value, low, high) -> str:
    return "--" if math.isnan(value) else f"{value:+.2f} [{low:+.2f}, {high:+.2f}]"


def write_audit_table(summary: pd.DataFrame, prefix: str, caption: str, groups: pd.DataFrame | None = None
                      ) -> list[Path]:
    """<prefix>.parquet (numeric columns), .md (with the groups' bounds, if any) and .tex (booktabs)."""
    headers = {c: HEADERS[c] for c in HEADERS if c in summary.columns}
    lines = []
    if groups is not None and len(groups):
        lines += ["", "By group of classes (each group's canaries alone: fewer canaries, less power). AUC: how "
                  "often an included canary outscores an excluded one (0.5: no exposure), with its 95 % interval; "
                  "against the rest: that AUC minus the other classes' (DeLong's variance, the groups' coins "
                  "independent).", "",
                  "| backbone | task | method | target eps | seed | audit | group | canaries | correct / guesses "
                  "| eps_lb | AUC [95 % CI] | AUC − rest [95 % CI] |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r.backbone} | {r.task} | {r.method} | {_cell(float(r.target_epsilon))} | {int(r.seed)} "
                  f"| {r.audit} | {r.group} | {r.canaries} | {r.correct} / {r.guesses} | {_cell(float(r.epsilon_lb))} "
                  f"| {r.auc:.2f} [{r.auc_low:.2f}, {r.auc_high:.2f}] "
                  f"| {_interval(r.auc_minus_rest, r.auc_minus_rest_low, r.auc_minus_rest_high)} |"
                  for r in groups.itertuples()]
    return write_small_table(summary, prefix, caption, headers, lambda column, row: _cell(row[column]),
                             markdown_after=lines)


def plot_audit(audits: pd.DataFrame, out: list[str], title: str) -> None:
    """Each audited model's bound against its claim, pooled audits large and single runs small; a non-private
    run (claim infinite) at the right edge."""
    plt = _pyplot()
    finite = audits["recomputed_claim"][audits["recomputed_claim"].map(math.isfinite)]
    top = max([float(finite.max()) if len(finite) else 1.0, float(audits["epsilon_lb"].max()), 1.0]) * 1.15
    fig, ax = plt.subplots(figsize=(5.6, 4.5))
    ax.plot([0, top], [0, top], color="0.5", linewidth=1, label="bound = claim (never above)")
    markers = {("white_box", "individual"): ("o", "0.1"), ("white_box", "merged"): ("s", "0.45"),
               ("black_box", "individual"): ("^", "0.1"), ("black_box", "merged"): ("v", "0.45")}
    for (kind, model), (marker, grey) in markers.items():
        chosen = audits[(audits["audit"] == kind) & (audits["model"] == model)]
        for pooled, size, alpha in ((False, 14, 0.35), (True, 60, 1.0)):
            part = chosen[chosen["pooled_runs"].notna() == pooled]
            if not len(part):
                continue
            x = part["recomputed_claim"].map(lambda c: top if not math.isfinite(c) else c)
            ax.scatter(x, part["epsilon_lb"], marker=marker, s=size, alpha=alpha, color=grey,
                       facecolors="none" if model == "merged" else grey,
                       label=f"{KIND_LABELS[kind]}, {model}" if pooled or not (chosen["pooled_runs"].notna().any())
                       else None)
    ax.axvline(top, color="0.8", linestyle=":", linewidth=1)
    ax.text(top, top * 0.55, "non-private runs (claim infinite)", fontsize=7, ha="right", va="center",
            rotation=90, color="0.4")
    ax.set(xlim=(0, top * 1.02), ylim=(0, top * 1.02), xlabel="claimed epsilon at the audit's delta",
           ylabel="audit's lower bound on epsilon (95 %)", title=title)
    ax.legend(fontsize=7, loc="upper left", title="large: a release group's pooled audit; small: one run",
              title_fontsize=6.5)
    fig.tight_layout()
    _save_all(fig, out)
    plt.close(fig)
