"""What every merge operator is, stated once and without torch: its name, its default hyperparameters, the
per-task data statistic it reads, which vectors it is defined on, whether it gives one model per task, and the
paper it comes from.

The implementations (merge.registry.OPERATORS: each kernel, with its mathematics in its docstring, in a family
module) take their defaults from here, and so do the one-call functions (merge.registry.ties(...), ...) made
from the two; the config check, the Snakefile and `dpmerge merge --help` can read this table without importing
torch or numpy (this module imports only the standard library).
Each entry names its paper by title and arXiv id (`description`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSpec:
    """One merge operator as the configuration sees it; merge.registry pairs it with its implementation."""

    name: str
    defaults: dict  # every hyperparameter the operator takes, with its default value
    summary: str  # one line: what the operator computes
    citation: str  # authors, venue, and which variant is implemented
    title: str  # the paper's title
    arxiv: str  # the paper's arXiv id
    # Kind of per-task data statistic it reads (privacy.statistics.KINDS), None for a data-free operator.
    statistic: str | None = None
    task_vectors_only: bool = False  # its reconstruction is defined on task vectors, not difference vectors
    personalized: bool = False  # one model per task: a shared tensor plus light per-task parts

    @property
    def description(self) -> str:
        """One line: what it computes and the paper it follows, by title and arXiv id."""
        return f'{self.summary} ({self.citation}; "{self.title}", arXiv {self.arxiv})'


# Where our operator departs from its reference code, a hyperparameter selects the reference's convention and
# defaults to ours (so results do not move): ties trim / zero_sign, tsv_m short_matrices, fisher normalization,
# emr rescale / zero_sign; the one-call functions of merge.registry (emr: merge.personalized) say how they differ.
_SPECS = (
    OperatorSpec(
        "weight_averaging", {},
        "the mean of the task vectors (model soup)",
        "Wortsman et al., ICML 2022",
        "Model soups: averaging weights of multiple fine-tuned models improves accuracy without increasing "
        "inference time", "2203.05482",
    ),
    OperatorSpec(
        "task_arithmetic", {"scaling": 0.3},
        "scaling times the sum of the task vectors",
        "Ilharco et al., ICLR 2023",
        "Editing Models with Task Arithmetic", "2212.04089",
    ),
    OperatorSpec(
        "ties", {"density": 0.2, "scaling": 1.0, "merge_func": "mean", "topk_scope": "global", "trim": "round",
                "zero_sign": "none"},
        "trim to the top-density magnitudes, elect a sign per entry, merge the agreeing entries",
        "Yadav et al., NeurIPS 2023",
        "TIES-Merging: Resolving Interference When Merging Models", "2306.01708",
    ),
    OperatorSpec(
        "dare", {"drop_rate": 0.5, "scaling": 0.3, "seed": 0},
        "drop entries at random and rescale the survivors, then task arithmetic",
        "Yu et al., ICML 2024 (DARE + task arithmetic)",
        "Language Models are Super Mario: Absorbing Abilities from Homologous Models as a Free Lunch",
        "2311.03099",
    ),
    OperatorSpec(
        "pcb", {"ratio": 0.05, "scaling": 1.2},
        "weighted mean with intra- and inter-task balance scores, the top ratio of them kept per task",
        "Du et al., NeurIPS 2024 (PCB-merging, without the evolutionary search of the coefficients)",
        "Parameter Competition Balancing for Model Merging", "2410.02396",
    ),
    OperatorSpec(
        "wudi", {"iterations": 300, "lr": 1e-5, "scaling": 1.0, "include_conv": True},
        "per weight matrix, Adam on the interference each task's own inputs see",
        "Cheng et al., ICML 2025 (WUDI-merging)",
        "Whoever Started the Interference Should End It: Guiding Data-Free Model Merging via Task Vectors",
        "2503.08099",
    ),
    OperatorSpec(
        "tsv_m", {"scaling": 1.0, "include_conv": True, "short_matrices": "average"},
        "per weight matrix, every task's top singular triplets, orthogonalised and recombined",
        "Gargiulo et al., CVPR 2025 (Task Singular Vectors, TSV-Merge)",
        "Task Singular Vectors: Reducing Task Interference in Model Merging", "2412.00081",
    ),
    OperatorSpec(
        "iso_c", {"scaling": 1.0, "include_conv": True},
        "per weight matrix, the summed task vectors with a flat (isotropic) singular spectrum",
        "Marczak et al., ICML 2025 (Iso-C, isotropic merging in the common subspace)",
        "No Task Left Behind: Isotropic Model Merging with Common and Task-Specific Subspaces", "2502.04959",
    ),
    OperatorSpec(
        "iso_cts", {"scaling": 1.0, "common_space_fraction": 0.8, "include_conv": True},
        "Iso-C over a common subspace plus every task's own directions outside it",
        "Marczak et al., ICML 2025 (Iso-CTS, common and task-specific subspaces)",
        "No Task Left Behind: Isotropic Model Merging with Common and Task-Specific Subspaces", "2502.04959",
    ),
    OperatorSpec(
        "ace", {"eps": 0.01, "gamma_threshold": 0.3, "k_fraction": 0.3, "scaling": 1.0, "stage": 4,
                "prior": "official", "include_conv": True},
        "per weight matrix, RegMean's closed form with each task's input covariance estimated from its own update",
        "Xu et al., CVPR 2026 (ACE-Merging, as its official code computes it; stage 1-4 = E1-E4 of its Table 4)",
        "ACE-Merging: Data-Free Model Merging with Adaptive Covariance Estimation", "2603.02945",
    ),
    OperatorSpec(
        "regmean", {"reduce_non_diagonal_ratio": 0.95},
        "per linear layer, the least-squares fit to every task's outputs from its input Gram matrices",
        "Jin et al., ICLR 2023 (RegMean)",
        "Dataless Knowledge Fusion by Merging Weights of Language Models", "2212.09849",
        statistic="gram",
    ),
    OperatorSpec(
        "fisher", {"normalize_fisher_weight": True, "minimal_fisher_weight": 1e-6, "normalization": "ours"},
        "the per-parameter mean of the task vectors weighted by each task's diagonal Fisher information",
        "Matena and Raffel, NeurIPS 2022 (Fisher merging)",
        "Merging Models with Fisher-Weighted Averaging", "2111.09832",
        statistic="fisher",
    ),
    OperatorSpec(
        "emr", {"rescale": "whole_vector", "zero_sign": "none"},
        "an elected unified vector plus, per task, a mask and a rescaler",
        "Huang et al., NeurIPS 2024 (EMR-merging: elect, mask, rescale; one model per task)",
        "EMR-Merging: Tuning-Free High-Performance Model Merging", "2405.17461",
        task_vectors_only=True, personalized=True,
    ),
    OperatorSpec(
        "tall_masks", {"tall_mask_lambda": 0.6},
        "the summed task vectors plus, per task, the TALL mask of the entries that matter to it",
        "Wang et al., ICML 2024 (TALL masks: w0 + m_t * sum tau per task)",
        "Localizing Task Information for Improved Model Merging and Compression", "2405.07813",
        task_vectors_only=True, personalized=True,
    ),
    OperatorSpec(
        "dts", {"rank_fraction": 0.3, "include_conv": True},
        "per task, a truncated SVD with 2-bit four-group codes for its singular vectors",
        "Guo et al., 2025 (DTS: truncated SVD + 2-bit 4-group codes per task; DTS-T on task vectors, DTS-D with "
        "vectors: difference)",
        "Stay Unique, Stay Efficient: Preserving Model Personality in Multi-Task Merging", "2512.01461",
        personalized=True,
    ),
    OperatorSpec(
        "consensus_ta", {"scaling": 0.3, "tall_mask_lambda": 0.6, "min_agreement": 2},
        "task arithmetic on the entries that at least min_agreement tasks' TALL masks select",
        "Wang et al., ICML 2024 (TALL masks, Consensus task arithmetic)",
        "Localizing Task Information for Improved Model Merging and Compression", "2405.07813",
    ),
)

# By name, in the order the schema, the config check and `dpmerge merge --help` list them.
SPECS: dict[str, OperatorSpec] = {spec.name: spec for spec in _SPECS}

# Operators that read per-task data statistics, and which kind (privacy.statistics.KINDS).
NEEDS_STATISTICS: dict[str, str] = {spec.name: spec.statistic for spec in _SPECS if spec.statistic is not None}

# What a merge may read: task vectors tau_t, or difference vectors tau_t - mean(tau) (merge_stream's `vectors`).
VECTOR_KINDS = ("task", "difference")

# What a merge can denoise its inputs with first (config merge.<entry>.denoise, `dpmerge denoise --method`;
# merge/denoise.py states the mathematics): post-processing of each release, from the vector alone.
DENOISERS = {
    "svd_shrink": "each weight matrix's singular values by Gavish-Donoho's Frobenius-optimal shrinker at the "
                  "noise floor estimated from the matrix; other tensors by James-Stein",
    "svd_hard": "each weight matrix's singular values above Gavish-Donoho's optimal hard threshold kept, the rest "
                "zeroed; other tensors by James-Stein",
    "james_stein": "every tensor shrunk towards zero by positive-part James-Stein at the release's pooled noise "
                   "level (no spectral structure)",
}
