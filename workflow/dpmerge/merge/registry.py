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

An operator lives in two places: its spec in merge/specs.py (name, defaults, statistic, paper; torch-free, for
the config check, the Snakefile and `--help`) and its kernel in a family module, whose docstring states its
mathematics. The one-call functions at the end (`ties(task_vectors, density=0.5)`, ...) are made from the two.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from dpmerge.merge import covariance, data_based, elementwise, personalized, spectral
from dpmerge.merge.checks import check_hyperparameters
from dpmerge.merge.sources import AtLeastFloat32, DifferenceSource, InMemorySource, TaskVector, VectorSource
from dpmerge.merge.specs import (
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


# The family modules, each with its IMPLEMENTATIONS by operator name
FAMILIES = (elementwise, spectral, covariance, personalized, data_based)


def _implementations() -> dict[str, dict]:
    """Every family's rules by operator name; a name claimed twice is an error, not a silent override."""
    found: dict[str, dict] = {}
    for family in FAMILIES:
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


@dataclass(frozen=True)
class ResolvedMerge:
    """One merge as it will run: the operator, its hyperparameters checked once and completed with the spec's
    defaults, and the vectors it merges. Everything a merge computes (the stream, the stored layout, the parts'
    storage, a personalized task's vector) is a method of it, so nothing re-reads or re-checks the settings."""

    operator: Operator
    hyperparameters: dict
    vectors: str = "task"

    @property
    def name(self) -> str:
        return self.operator.spec.name

    @property
    def personalized(self) -> bool:
        return self.operator.parts_layout is not None

    def stream(self, source: VectorSource) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, merged task vector tensor) for every parameter, reading one tensor per task at a time. Computed
        in at least float32 (AtLeastFloat32: in float16 a rule's small guards round to 0 and its divisions to
        NaN) and handed back at the precision the vectors are stored in."""
        computed = AtLeastFloat32(source)
        if self.vectors == "difference":
            merged = _merged_differences(self.operator, self.hyperparameters, DifferenceSource(computed))
        else:
            merged = _merged_tensors(self.operator, self.hyperparameters, computed)
        return ((key, computed.stored(tensor, key.split("/", 3)[3] if is_part(key) else key))
                for key, tensor in merged)

    def stored_layout(self, layout: dict, tasks: int) -> dict:
        """Names, dtypes and shapes the merge stores, in order: `layout` (the vectors' name -> (dtype, shape))
        for a plain operator; each shared tensor followed by every task's parts for a personalized one."""
        if not self.personalized:
            return dict(layout)
        stored = {}
        for key, (dtype, shape) in layout.items():
            stored[key] = (dtype, shape)
            for index in range(tasks):
                for name, part in self.operator.parts_layout(shape, dtype, **self.hyperparameters).items():
                    stored[part_key(index, name, key)] = part
        return stored

    def part_bits(self, shape, dtype) -> int:
        """Deployment storage of one task's parts of one tensor, in bits (masks 1 bit, DTS codes 2 bits per
        entry, scalars at the tensor's precision)."""
        bits = 0
        float_bits = torch.empty((), dtype=dtype).element_size() * 8
        for name, (part_dtype, part_shape) in self.operator.parts_layout(shape, dtype, **self.hyperparameters).items():
            count = int(torch.Size(part_shape).numel())
            bits += count * (1 if name == "mask" else 2 if part_dtype == torch.uint8 else float_bits)
        return bits

    def personal_vector(self, shared: dict, parts: dict, task_index: int) -> TaskVector:
        """Task `task_index`'s vector from a personalized merge: `shared` maps names to shared tensors (relative
        to w0), `parts` holds the stored parts (names from part_key)."""
        out = {}
        for key, value in shared.items():
            task_parts = {name: parts[part_key(task_index, name, key)]
                          for name in self.operator.parts_layout(value.shape, value.dtype, **self.hyperparameters)}
            out[key] = self.operator.reconstruct(value, task_parts, **self.hyperparameters)
        return out


def resolve_merge(operator: str, vectors: str = "task", **hyperparameters) -> ResolvedMerge:
    """The operator and its hyperparameters checked (ValueError naming them) and completed with its defaults.

    vectors="task" merges the task vectors tau_t = theta_t - w0. vectors="difference" merges the difference
    vectors d_t = tau_t - mean_j tau_j instead and returns mean_j tau_j + merged(d), i.e. the merged model
    theta_avg + merged(d), still expressed relative to w0.
    """
    hyper = check_hyperparameters(operator, hyperparameters)
    op = OPERATORS[operator]
    if vectors not in VECTOR_KINDS:
        raise ValueError(f"vectors must be one of {', '.join(VECTOR_KINDS)}, got {vectors!r}")
    if vectors == "difference" and op.task_vectors_only:
        raise ValueError(f"{operator} is defined on task vectors only; use vectors: task")
    return ResolvedMerge(op, hyper, vectors)


def merge_stream(
    operator: str, source: VectorSource, vectors: str = "task", **hyperparameters
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged task vector tensor) for every parameter, reading one tensor per task at a time
    (resolve_merge: what `vectors` means). The operator and its hyperparameters are checked now; tensors are
    read and merged as the result is iterated."""
    return resolve_merge(operator, vectors, **hyperparameters).stream(source)


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


def is_personalized(operator: str) -> bool:
    return OPERATORS[operator].parts_layout is not None


def personal_vector(operator: str, shared: dict, parts: dict, task_index: int, **hyperparameters) -> TaskVector:
    """Task `task_index`'s vector from a personalized merge (ResolvedMerge.personal_vector)."""
    return resolve_merge(operator, **hyperparameters).personal_vector(shared, parts, task_index)


def merge(operator: str, task_vectors: list[TaskVector], vectors: str = "task", statistics=None,
          **hyperparameters) -> TaskVector:
    """Merge in-memory task vectors with a registered operator (the same computation as `merge_stream`).
    `statistics`: per-task dicts of Gram matrices / Fisher diagonals for regmean / fisher."""
    return dict(merge_stream(operator, InMemorySource(task_vectors, statistics=statistics), vectors,
                             **hyperparameters))


# One call per operator for use from Python: ties(task_vectors, density=0.5), regmean(task_vectors, grams). The
# hyperparameters are the spec's keywords (those not given take its defaults; an unknown one is a ValueError
# naming the allowed ones); the docstring is the spec's line and the mathematics beside the operator's kernel.
def _one_call(name: str) -> Callable[..., TaskVector]:
    operator = OPERATORS[name]
    if operator.spec.statistic is None:
        def call(task_vectors: list[TaskVector], **hyperparameters) -> TaskVector:
            return merge(name, task_vectors, "task", None, **hyperparameters)
    else:
        def call(task_vectors: list[TaskVector], statistics: list[dict], **hyperparameters) -> TaskVector:
            return merge(name, task_vectors, "task", statistics, **hyperparameters)
    defaults = ", ".join(f"{key}={value!r}" for key, value in operator.defaults.items()) or "none"
    call.__name__ = call.__qualname__ = name
    call.__doc__ = (f"{operator.spec.description}.\n\nHyperparameters (defaults): {defaults}.\n\n"
                    f"{inspect.getdoc(operator.per_tensor) or ''}")
    return call


# Personalized operators give one model per task, not one merged vector: they are merged with merge_stream.
ONE_CALL = {name: _one_call(name) for name, op in OPERATORS.items() if op.parts_layout is None}


def __getattr__(name: str) -> Callable[..., TaskVector]:
    """`from dpmerge.merge.registry import ties`: each operator's one call, made from its spec and kernel (PEP 562),
    so a new operator needs no line here (docs/architecture.md, "Add a merge operator")."""
    if name in ONE_CALL:
        return ONE_CALL[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *ONE_CALL])
