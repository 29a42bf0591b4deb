"""The merge operators by name, and how a merge runs: streamed tensor by tensor, or in memory.

Each operator is a pure function: a list of task vectors (mapping parameter name -> tensor of w_t - w0, all
with the same keys and shapes) plus hyperparameters -> one merged task vector. The merged model is
w0 + merged vector. Merging reads only released vectors, so it is post-processing: no privacy cost.

Every operator is written as a per-tensor rule, optionally preceded by a statistics pass over whole task
vectors (TIES's global top-k threshold). `merge_stream` runs it over a `VectorSource` that yields one tensor of
every task at a time, so peak memory is one merged model plus one tensor per task (plus, for a statistics pass,
one task vector at a time), never T models; `merge` is the same computation over in-memory dicts, bit for bit.

`OPERATORS` pairs every operator's spec (name, default hyperparameters, paper: merge/specs.py, the only place
defaults are stated) with its implementation (merge/elementwise.py, merge/spectral.py, merge/personalized.py,
merge/data_based.py); the config and the CLI look operators up here. Beyond the per-tensor rules:
- RegMean and Fisher merging also read per-task data statistics (a `StatisticsSource`, one key at a time);
  privacy/statistics.py computes them on public data or privatized.
- Personalized operators (EMR, TALL masks, DTS) store a shared tensor and, per task, light parts from which
  `personal_vector` rebuilds that task's own vector at evaluation.
- Any operator that is not defined on task vectors only can merge difference vectors tau_t - mean(tau)
  (`vectors="difference"`), the result then being mean(tau) + the merged differences.

The one-call functions at the end (`ties(task_vectors, density=0.5)`, ...) take an operator's hyperparameters
as keywords; those not given take the defaults of merge/specs.py. The papers, by title and arXiv id:
weight averaging, "Model soups: averaging weights of multiple fine-tuned models improves accuracy without
increasing inference time" (arXiv 2203.05482); task arithmetic, "Editing Models with Task Arithmetic" (arXiv
2212.04089); TIES, "TIES-Merging: Resolving Interference When Merging Models" (arXiv 2306.01708); DARE,
"Language Models are Super Mario: Absorbing Abilities from Homologous Models as a Free Lunch" (arXiv
2311.03099); PCB, "Parameter Competition Balancing for Model Merging" (arXiv 2410.02396); WUDI, "Whoever
Started the Interference Should End It: Guiding Data-Free Model Merging via Task Vectors" (arXiv 2503.08099);
TSV-M, "Task Singular Vectors: Reducing Task Interference in Model Merging" (arXiv 2412.00081); Iso-C and
Iso-CTS, "No Task Left Behind: Isotropic Model Merging with Common and Task-Specific Subspaces" (arXiv
2502.04959); TALL masks and consensus TA, "Localizing Task Information for Improved Model Merging and
Compression" (arXiv 2405.07813); EMR, "EMR-Merging: Tuning-Free High-Performance Model Merging" (arXiv
2405.17461); DTS, "Stay Unique, Stay Efficient: Preserving Model Personality in Multi-Task Merging" (arXiv
2512.01461); RegMean, "Dataless Knowledge Fusion by Merging Weights of Language Models" (arXiv 2212.09849);
Fisher merging, "Merging Models with Fisher-Weighted Averaging" (arXiv 2111.09832).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from dpmerge.merge import data_based, elementwise, personalized, spectral
from dpmerge.merge.checks import check_hyperparameters
from dpmerge.merge.sources import DifferenceSource, InMemorySource, TaskVector, VectorSource
from dpmerge.merge.specs import (
    NEEDS_STATISTICS,  # noqa: F401 - the CLI and the workflow read it from here
    SPECS,
    VECTOR_KINDS,
    OperatorSpec,
)


@dataclass(frozen=True)
class Operator:
    """A merge rule: `per_tensor(key, tensors, stats, **hyper)` -> merged tensor, after an optional
    `statistics(source, **hyper)` pass whose result (`stats`) every per-tensor call sees. Its name, defaults,
    citation and the vectors it is defined on are its `spec`'s (merge/specs.py)."""

    spec: OperatorSpec
    per_tensor: Callable[..., torch.Tensor]
    statistics: Callable[..., object] | None = None
    # Personalized operators (EMR, TALL masks, DTS) keep per-task parts beside the shared tensor: per_tensor
    # returns (shared, [parts of task t]), parts_layout(shape, dtype, **hyper) gives each part's (dtype, shape)
    # and reconstruct(shared, parts, **hyper) rebuilds task t's vector. Stored as PERSONAL/<t>/<part>/<name>.
    parts_layout: Callable[..., dict] | None = None
    reconstruct: Callable[..., torch.Tensor] | None = None

    @property
    def defaults(self) -> dict:
        return self.spec.defaults

    @property
    def citation(self) -> str:
        return self.spec.citation

    @property
    def task_vectors_only(self) -> bool:
        return self.spec.task_vectors_only


def _implementations() -> dict[str, dict]:
    """Every family's rules by operator name; a name claimed twice is an error, not a silent override."""
    found: dict[str, dict] = {}
    for family in (elementwise, spectral, personalized, data_based):
        for name, implementation in family.IMPLEMENTATIONS.items():
            if name in found:
                raise RuntimeError(f"merge operator {name!r} is implemented twice (again in {family.__name__})")
            found[name] = implementation
    return found


def _registered() -> dict[str, Operator]:
    implementations = _implementations()
    if set(implementations) != set(SPECS):
        raise RuntimeError(f"merge operators without an implementation: {sorted(set(SPECS) - set(implementations))}"
                           f"; implementations without a spec: {sorted(set(implementations) - set(SPECS))}")
    operators = {name: Operator(spec, **implementations[name]) for name, spec in SPECS.items()}
    for name, operator in operators.items():
        if operator.spec.personalized != (operator.parts_layout is not None):
            raise RuntimeError(f"merge operator {name!r}: its spec and its implementation disagree on whether it "
                               "is personalized")
    return operators


# In the order of merge/specs.py (the schema's and `dpmerge merge --help`'s order).
OPERATORS: dict[str, Operator] = _registered()


def _resolve(operator: str, hyperparameters: dict) -> tuple[Operator, dict]:
    return OPERATORS.get(operator), check_hyperparameters(operator, hyperparameters)


def merge_stream(
    operator: str, source: VectorSource, vectors: str = "task", **hyperparameters
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged task vector tensor) for every parameter, reading one tensor per task at a time.

    vectors="task" merges the task vectors tau_t = theta_t - w0. vectors="difference" merges the difference
    vectors d_t = tau_t - mean_j tau_j instead and returns mean_j tau_j + merged(d), i.e. the merged model
    theta_avg + merged(d), still expressed relative to w0.

    The operator and its hyperparameters are checked now (ValueError naming them); tensors are read and merged
    as the result is iterated.
    """
    op, hyper = _resolve(operator, hyperparameters)
    if vectors not in VECTOR_KINDS:
        raise ValueError(f"vectors must be one of {', '.join(VECTOR_KINDS)}, got {vectors!r}")
    if vectors == "difference" and op.task_vectors_only:
        raise ValueError(f"{operator} is defined on task vectors only; use vectors: task")
    if vectors == "difference":
        return _merged_differences(op, hyper, DifferenceSource(source))
    return _merged_tensors(op, hyper, source)


@torch.no_grad()
def _merged_tensors(op: Operator, hyper: dict, source: VectorSource):
    """(name, tensor) in stored order: each shared tensor, then (personalized operators) every task's parts."""
    stats = op.statistics(source, **hyper) if op.statistics is not None else None
    for key in source.keys():
        merged = op.per_tensor(key, source.tensors(key), stats, **hyper)
        if op.parts_layout is None:
            yield key, merged
            continue
        shared, parts = merged
        yield key, shared
        for index, task_parts in enumerate(parts):
            for name in op.parts_layout(source.shape(key), shared.dtype, **hyper):
                yield part_key(index, name, key), task_parts[name]


PERSONAL = "personal"  # stored parts are named PERSONAL/<task>/<part>/<tensor name>


def part_key(task_index: int, part: str, key: str) -> str:
    return f"{PERSONAL}/{task_index}/{part}/{key}"


def is_part(key: str) -> bool:
    return key.startswith(PERSONAL + "/")


def _merged_differences(op: Operator, hyper: dict, source: DifferenceSource):
    for key, merged in _merged_tensors(op, hyper, source):
        yield key, merged if is_part(key) else source.mean(key) + merged


def stored_layout(operator: str, layout: dict, tasks: int, **hyperparameters) -> dict:
    """Names, dtypes and shapes a merge stores, in order: `layout` (the vectors' name -> (dtype, shape)) for a
    plain operator; each shared tensor followed by every task's parts for a personalized one."""
    op, hyper = _resolve(operator, hyperparameters)
    if op.parts_layout is None:
        return dict(layout)
    stored = {}
    for key, (dtype, shape) in layout.items():
        stored[key] = (dtype, shape)
        for index in range(tasks):
            for name, part in op.parts_layout(shape, dtype, **hyper).items():
                stored[part_key(index, name, key)] = part
    return stored


def part_bits(operator: str, shape, dtype, **hyperparameters) -> int:
    """Deployment storage of one task's parts of one tensor, in bits (masks 1 bit, DTS codes 2 bits per entry,
    scalars at the tensor's precision)."""
    op, hyper = _resolve(operator, hyperparameters)
    bits = 0
    float_bits = torch.empty((), dtype=dtype).element_size() * 8
    for name, (part_dtype, part_shape) in op.parts_layout(shape, dtype, **hyper).items():
        count = int(torch.Size(part_shape).numel())
        bits += count * (1 if name == "mask" else 2 if part_dtype == torch.uint8 else float_bits)
    return bits


def is_personalized(operator: str) -> bool:
    return OPERATORS[operator].parts_layout is not None


def personal_vector(operator: str, shared: dict, parts: dict, task_index: int, **hyperparameters) -> TaskVector:
    """Task `task_index`'s vector from a personalized merge: `shared` maps names to shared tensors (relative to
    w0), `parts` holds the stored parts (names from part_key)."""
    op, hyper = _resolve(operator, hyperparameters)
    out = {}
    for key, value in shared.items():
        task_parts = {name: parts[part_key(task_index, name, key)]
                      for name in op.parts_layout(value.shape, value.dtype, **hyper)}
        out[key] = op.reconstruct(value, task_parts, **hyper)
    return out


def merge(operator: str, task_vectors: list[TaskVector], vectors: str = "task", statistics=None,
          **hyperparameters) -> TaskVector:
    """Merge in-memory task vectors with a registered operator (the same computation as `merge_stream`).
    `statistics`: per-task dicts of Gram matrices / Fisher diagonals for regmean / fisher."""
    return dict(merge_stream(operator, InMemorySource(task_vectors, statistics=statistics), vectors,
                             **hyperparameters))


# One-call functions by operator name, for use from Python. Hyperparameters are keywords of the operator's
# spec; the ones not given take the defaults of merge/specs.py (an unknown one is a ValueError naming the
# allowed ones).
def weight_averaging(task_vectors: list[TaskVector]) -> TaskVector:
    """Weight averaging / model soups (Wortsman et al., 2022, "Model soups", arXiv 2203.05482):
    w = mean_t w_t, i.e. tau = mean_t tau_t."""
    return merge("weight_averaging", task_vectors)


def task_arithmetic(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """Task arithmetic (Ilharco et al., 2023, "Editing Models with Task Arithmetic", arXiv 2212.04089):
    tau = scaling * sum_t tau_t.

    Args:
        scaling: lambda; 0.3 is the paper's setting (App. B.3). scaling = 1/T reproduces weight averaging.
    """
    return merge("task_arithmetic", task_vectors, "task", None, **hyperparameters)


def ties(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """TIES-merging (Yadav et al., 2023, "TIES-Merging: Resolving Interference When Merging Models", arXiv
    2306.01708): trim, elect sign, disjoint merge.

    1. Trim: keep the top `density` fraction of each task vector's entries by magnitude.
    2. Elect: per coordinate, the sign of the summed trimmed values (the sign carrying more mass).
    3. Disjoint merge: combine only the entries that agree with the elected sign, then multiply by `scaling`.

    Args:
        density: fraction kept in the trim step (paper: 0.2, i.e. top 20%).
        scaling: lambda applied to the merged vector. With merge_func="mean" the TIES paper's lambda = 1 is
            the natural default; FusionBench/AdaMerging's CLIP convention is merge_func="sum" with 0.3.
        merge_func: "mean" (mean over agreeing entries, the TIES paper's disjoint mean) or "sum".
        topk_scope: "global" (threshold over the whole flattened task vector, as the TIES code does) or
            "per_tensor" (threshold within each parameter tensor).
        trim: how many entries the trim step keeps out of K. "round": round(density * K), the paper's "top k%"
            (so density 0 keeps nothing and 1 everything; the code's extra entry comes from its rank arithmetic).
            "reference": as topk_values_mask of the TIES code (prateeky2806/ties-merging
            src/utils/merge_utils.py, the same in FusionBench's method/ties_merging/ties_merging_utils.py),
            every entry with |v| >= the (K - int(density * K))-th smallest |v|: int(density * K) + 1 entries
            when magnitudes are distinct, more on ties at the threshold, one even at density 0; density 1 is
            refused (the reference's kthvalue(0) fails there).
        zero_sign: where the trimmed values of an entry sum to exactly 0. "none": the paper's sgn(0) = 0
            elects no sign and the entry merges to 0. "majority": as resolve_sign / resolve_zero_signs of the
            TIES code, the entry takes the sign of the sum of every elected sign over the whole vector (one
            extra read) and its disjoint merge keeps the values of that sign, the negative ones if that sum is
            0 too.
        trim="reference" with zero_sign="majority" and topk_scope="global" is the TIES code exactly.
    """
    return merge("ties", task_vectors, "task", None, **hyperparameters)


def dare(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """DARE (Yu et al., 2024, "Language Models are Super Mario", arXiv 2311.03099): drop and rescale, then task
    arithmetic.

    Each task vector entry is dropped with probability `drop_rate` and the survivors are rescaled by
    1 / (1 - drop_rate), so each task vector is unchanged in expectation; the sparsified vectors are then
    summed and scaled by `scaling` (task arithmetic's lambda). Masks are seeded per (seed, task, tensor).

    Args:
        drop_rate: p in [0, 1); p = 0 is plain task arithmetic.
        scaling: lambda of the task-arithmetic sum (the same default as task_arithmetic's).
        seed: seed of the drop masks.
    """
    return merge("dare", task_vectors, "task", None, **hyperparameters)


def pcb(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """PCB-merging (Du et al., 2024, "Parameter Competition Balancing for Model Merging", arXiv 2410.02396), as
    PCB_merge in its reference code.

    Over each task vector flattened whole: clamp |tau| to its [1e-4, 1 - 1e-4] quantiles; score every entry by
    intra-balance exp(T * norm(|tau|)^2) (its importance within the task) times inter-balance
    tanh(tau_i * sum_j tau_j) (its agreement with the other tasks); keep the top `ratio` fraction of scores
    per task (clamp below at the (1 - ratio) quantile) and min-max normalise them into weights; merge as the
    weighted mean sum_i w_i tau_i / sum_i w_i, times `scaling`. Quantiles are exact, streamed.

    Args:
        ratio: fraction of entries per task that keep a non-zero weight (reference script: 0.05).
        scaling: lambda (reference script: 1.2 for every task before its optional evolutionary search of
            per-task coefficients on validation data, which a data-free merge cannot do).
    """
    return merge("pcb", task_vectors, "task", None, **hyperparameters)


def wudi(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """WUDI-merging (Cheng et al., 2025, "Whoever Started the Interference Should End It", arXiv 2503.08099).

    Per weight matrix, tau minimises sum_i ||(tau - tau_i) tau_i^T||_F^2 / ||tau_i||_F^2 (interference on the
    inputs spanned by each task's own update) by Adam from tau = sum_i tau_i; other tensors are averaged.
    Deterministic: no random component (start point and steps are fixed by the inputs).

    Args:
        iterations, lr: Adam steps and learning rate (reference code: 300, 1e-5).
        scaling: applied to the merged vector (reference: 1).
        include_conv: also treat convolution weights as (out, in*kh*kw) matrices (the reference has 2-D only).
    """
    return merge("wudi", task_vectors, "task", None, **hyperparameters)


def tsv_m(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """TSV-Merge (Gargiulo et al., 2025, "Task Singular Vectors", arXiv 2412.00081): per weight matrix keep each
    task's top min(out, in) / T singular triplets, concatenate them, orthogonalise the left and right singular
    vectors (polar factor, removing inter-task interference) and recombine; other tensors averaged; times
    `scaling` (alpha, reference 1). `include_conv` as for wudi.

    short_matrices: a matrix with fewer singular directions than tasks (min(out, in) < T, so each task's share
    min(out, in) // T is 0). "average": averaged like a non-matrix tensor, so it still moves. "zero": as the
    reference code (compute_and_sum_svd_mem_reduction in AntoAndGar/task_singular_vectors
    src/utils/TSVM_utils.py and FusionBench's method/task_singular_vector/utils/TSVM_utils.py), whose
    concatenation of zero triplets per task recombines to 0: the matrix keeps w0, dropping every task's
    update there, which the paper does not ask for; averaging keeps it, as for other tensors. The original
    code also averages every tensor whose name holds "text_projection" (CLIP's text projection), which we do
    not single out; with include_conv=False and short_matrices="zero" we match FusionBench's TSVM without
    exclude_keys (up to rounding: we compute in float32 where it keeps float64 inputs in float64)."""
    return merge("tsv_m", task_vectors, "task", None, **hyperparameters)


def iso_c(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """Iso-C (Marczak et al., 2025, "No Task Left Behind", arXiv 2502.04959): per weight matrix, the SVD of
    sum_t tau_t with every singular value replaced by their mean (an isotropic spectrum); other tensors
    averaged; times `scaling` (alpha; FusionBench default 1, the paper tunes it on validation data).
    `include_conv` as for wudi."""
    return merge("iso_c", task_vectors, "task", None, **hyperparameters)


def iso_cts(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """Iso-CTS (Marczak et al., 2025, arXiv 2502.04959): like Iso-C, but only `common_space_fraction` of the
    directions come from the sum's top singular vectors; the rest are split equally between tasks, each filled
    with that task's top directions outside the common subspace; then orthogonalised and given an isotropic
    spectrum. `scaling` and `include_conv` as for iso_c."""
    return merge("iso_cts", task_vectors, "task", None, **hyperparameters)


def consensus_ta(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
    """Consensus task arithmetic (Wang et al., 2024, "Localizing Task Information for Improved Model Merging
    and Compression", arXiv 2405.07813): task arithmetic restricted to the entries that at least
    `min_agreement` tasks' TALL masks select (k = 2 in the paper), removing "selfish" (one task) and
    "catastrophic" (no task) weights.

    Args:
        scaling: task arithmetic's lambda (the same default as task_arithmetic's).
        tall_mask_lambda: the TALL mask threshold (the paper picks it per task on validation data from
            {0.2, ..., 0.6}; data-free, one value for all, FusionBench's TALL default 0.6).
        min_agreement: k.
    """
    return merge("consensus_ta", task_vectors, "task", None, **hyperparameters)


def regmean(task_vectors: list[TaskVector], grams: list[dict], **hyperparameters) -> TaskVector:
    """RegMean (Jin et al., 2023, "Dataless Knowledge Fusion by Merging Weights of Language Models", arXiv
    2212.09849): per linear layer, the weights minimising the summed squared output difference to every task
    model on its own inputs, in closed form from the Gram matrices of those inputs; other tensors averaged.

    Args:
        grams: per task, {weight name: mean input Gram (in x in)} (privacy.statistics.gram_statistics).
        reduce_non_diagonal_ratio: alpha scaling the Grams' off-diagonal entries (FusionBench: 0.95 for CLIP
            vision models, 0.1 in its generic/language configuration).
    """
    return merge("regmean", task_vectors, "task", grams, **hyperparameters)


def fisher(task_vectors: list[TaskVector], fishers: list[dict], **hyperparameters) -> TaskVector:
    """Fisher merging (Matena and Raffel, 2022, "Merging Models with Fisher-Weighted Averaging", arXiv
    2111.09832): per parameter, the Fisher-weighted mean sum_i F_i tau_i / sum_i F_i (= the weighted mean of
    the fine-tuned weights, minus w0).

    Args:
        fishers: per task, {parameter name: diagonal Fisher} (privacy.statistics.fisher_statistics).
        normalize_fisher_weight: divide each task's Fisher by its global L2 norm first (FusionBench default).
        minimal_fisher_weight: m, added to every weight so coordinates no task informs are averaged.
        normalization: where m enters when normalising. "ours": F_t / ||F_t|| + m (the floor is the same for
            every task, so a task whose Fisher is all 0, i.e. that knows nothing, weighs least). "reference": as
            merging_with_fisher_weights in FusionBench's method/fisher_merging/fisher_merging.py (from
            MergeLM), (F_t + m) / (||F_t|| + m) up to a factor common to all tasks; a task whose Fisher is
            all 0 then weighs m / m = 1 everywhere, more than any normalised informative entry. Without
            normalising both are F_t + m.
    """
    return merge("fisher", task_vectors, "task", fishers, **hyperparameters)
