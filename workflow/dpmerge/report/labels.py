"""What the paper calls things: method, operator and table-row labels for tables, figures and captions."""

from __future__ import annotations

from dpmerge.methods import METHODS

METHOD_LABELS = {name: method.label for name, method in METHODS.items()}
# Table 5's rows: (method, label); dp_sam keeps SAM and drops the anchor, dp_anchor the reverse
ABLATION_ROWS = tuple((name, method.ablation_row) for name, method in METHODS.items() if method.ablation_row)
SENSITIVITY_SYMBOLS = {"rho": "ρ", "anchor_lambda": "λ"}
OPERATOR_LABELS = {
    "weight_averaging": "Weight Averaging", "task_arithmetic": "Task Arithmetic", "ties": "TIES", "dare": "DARE",
    "pcb": "PCB", "wudi": "WUDI", "tsv_m": "TSV-M", "iso_c": "Iso-C", "iso_cts": "Iso-CTS", "ace": "ACE",
    "regmean": "RegMean", "fisher": "Fisher", "consensus_ta": "Consensus TA", "emr": "EMR (per-task models)",
    "tall_masks": "TALL masks (per-task models)", "dts": "DTS-T (per-task models)",
    "dts_difference": "DTS-D (per-task models)",
}
AVERAGE = "Avg."
# Merged / individual score of the same method, averaged over tasks, in % (the merging literature's measure)
NORMALIZED = "Avg. normalized (%)"
# Table 1's improvement column ("improvement" in its name makes its cells signed)
AVERAGE_GAIN = "Avg. improvement over DP"


def operator_label(name: str) -> str:
    """Label of a configured merge: the operator's, 'ties_difference' -> 'TIES (difference vectors)',
    'ties_denoised' -> 'TIES, denoised', 'ace_e1' -> 'ACE E1'."""
    if name in OPERATOR_LABELS:
        return OPERATOR_LABELS[name]
    base, _, variant = name.rpartition("_")
    if variant == "difference" and base in OPERATOR_LABELS:
        return f"{OPERATOR_LABELS[base]} (difference vectors)"
    if variant == "denoised" and base:
        return f"{operator_label(base)}, denoised"
    if base == "ace" and variant in ("e1", "e2", "e3", "e4"):  # ACE's ablation stages (presets/ace.yaml)
        return f"ACE {variant.upper()}"
    return name


def label_of(mapping: dict, key: str) -> str:
    return mapping.get(key, key)
