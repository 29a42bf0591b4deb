"""Merge operators on hand-computable task vectors and against their defining properties."""

import pytest
import torch

from dpmerge.artifacts import file_tensors_sha256, save_tensors, tensors_sha256
from dpmerge.merge.elementwise import _ties_thresholds
from dpmerge.merge.order_statistics import top_magnitude_threshold
from dpmerge.merge.registry import (
    OPERATORS,
    dare,
    merge,
    merge_stream,
    task_arithmetic,
    ties,
    weight_averaging,
)
from dpmerge.merge.sources import InMemorySource, SafetensorsSource, StatisticsSource
from dpmerge.merge.specs import NEEDS_STATISTICS


def tv(**tensors):
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in tensors.items()}


def test_weight_averaging_by_hand():
    merged = weight_averaging([tv(a=[1.0, 2.0], b=[[4.0]]), tv(a=[3.0, -2.0], b=[[0.0]])])
    assert torch.equal(merged["a"], torch.tensor([2.0, 0.0]))
    assert torch.equal(merged["b"], torch.tensor([[2.0]]))


def test_task_arithmetic_by_hand_and_equals_averaging_at_one_over_t():
    vectors = [tv(a=[1.0, 2.0]), tv(a=[3.0, -2.0]), tv(a=[2.0, 6.0])]
    assert torch.allclose(task_arithmetic(vectors, scaling=0.3)["a"], torch.tensor([1.8, 1.8]))
    assert torch.allclose(task_arithmetic(vectors, scaling=1 / 3)["a"], weight_averaging(vectors)["a"])


def test_ties_by_hand():
    # density 0.5 keeps the 2 largest-magnitude entries of each 4-entry vector (global top-k).
    t1 = tv(a=[4.0, -1.0, 0.5, -3.0])  # keeps 4, -3
    t2 = tv(a=[2.0, 5.0, 0.1, 1.0])  # keeps 2, 5
    t3 = tv(a=[-1.0, 0.2, 0.3, 6.0])  # keeps -1, 6
    # elected signs from trimmed sums: [4+2-1=+5, +5, 0, -3+6=+3] -> [+, +, 0, +]
    # disjoint mean over agreeing entries: [mean(4,2)=3, 5, 0, 6]
    merged = ties([t1, t2, t3], density=0.5, scaling=1.0, merge_func="mean")
    assert torch.allclose(merged["a"], torch.tensor([3.0, 5.0, 0.0, 6.0]))
    summed = ties([t1, t2, t3], density=0.5, scaling=0.3, merge_func="sum")
    assert torch.allclose(summed["a"], 0.3 * torch.tensor([6.0, 5.0, 0.0, 6.0]))


def test_ties_global_topk_spans_tensors_but_per_tensor_does_not():
    vector = tv(a=[10.0, 9.0], b=[1.0, 0.5])
    global_ = ties([vector], density=0.5, topk_scope="global")
    per_tensor = ties([vector], density=0.5, topk_scope="per_tensor")
    assert torch.equal(global_["b"], torch.zeros(2))
    assert torch.equal(per_tensor["b"], torch.tensor([1.0, 0.0]))


def test_ties_density_one_single_task_reproduces_it_scaled():
    vector = {"w": torch.randn(5, 3, generator=torch.Generator().manual_seed(0))}
    merged = ties([vector], density=1.0, scaling=0.7)
    assert torch.allclose(merged["w"], 0.7 * vector["w"])


def test_ties_disagreeing_signs_take_the_heavier_side():
    merged = ties([tv(a=[3.0]), tv(a=[-1.0]), tv(a=[-1.5])], density=1.0)
    assert torch.allclose(merged["a"], torch.tensor([3.0]))  # +3 outweighs -2.5; only agreeing entries kept


def test_registry_rejects_unknown_operator_and_hyperparameter():
    with pytest.raises(ValueError, match="known operators: " + ", ".join(sorted(OPERATORS))):
        merge("nope", [tv(a=[1.0])])
    with pytest.raises(ValueError, match="allowed: scaling"):
        merge("task_arithmetic", [tv(a=[1.0])], density=0.1)


def test_mismatched_task_vectors_are_refused():
    with pytest.raises(ValueError, match=r"task vector 1 lacks tensors that task vector 0 has: \['a'\]"):
        weight_averaging([tv(a=[1.0]), tv(b=[1.0])])
    with pytest.raises(ValueError, match=r"task vector 1 has tensors that task vector 0 lacks: \['b'\]"):
        weight_averaging([tv(a=[1.0]), tv(a=[1.0], b=[2.0])])
    with pytest.raises(ValueError, match="'a' has shape"):
        weight_averaging([tv(a=[1.0]), tv(a=[1.0, 2.0])])
    with pytest.raises(ValueError, match="'a' has dtype torch.float64"):
        weight_averaging([tv(a=[1.0]), {"a": torch.tensor([1.0], dtype=torch.float64)}])
    with pytest.raises(ValueError, match="task vector 1: tensor 'a' contains NaN or Inf"):
        weight_averaging([tv(a=[1.0]), tv(a=[float("nan")])])
    with pytest.raises(ValueError, match="at least one"):
        weight_averaging([])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_finiteness_check_finds_every_nan_and_inf_and_no_finite_value(dtype):
    from dpmerge.artifacts import all_finite as _all_finite

    big = float(torch.finfo(dtype).max) / 2  # finite, but its square overflows the sum of squares
    for values, finite in (([1.0, -2.0, 0.0], True), ([big, -big, 1.0], True), ([], True),
                           ([1.0, float("nan"), 2.0], False), ([float("inf"), 1.0], False),
                           ([1.0, float("-inf")], False), ([float("inf"), float("-inf")], False)):
        assert _all_finite(torch.tensor(values, dtype=dtype)) is finite, (values, dtype)
    strided = torch.ones(6, 4, dtype=dtype)
    strided[5, 0] = float("nan")
    assert _all_finite(strided.T) is False and _all_finite(strided[:5].T) is True


@pytest.mark.parametrize("operator", ["pcb", "wudi", "regmean", "ace"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rules_that_free_each_task_tensor_leave_the_callers_vectors_alone(operator, dtype):
    """PCB, WUDI and RegMean empty the list of task tensors they are handed as they go (merge.sources.consume)
    and RegMean works in float64: none of it may reach the caller's tensors."""
    from dpmerge.merge.sources import consume

    generator = torch.Generator().manual_seed(3)
    vectors = [{"w": torch.randn(6, 4, generator=generator, dtype=dtype)} for _ in range(3)]
    grams = [{"w": (lambda x: x.T @ x)(torch.randn(9, 4, generator=generator, dtype=dtype))} for _ in range(3)]
    before = [{k: v.clone() for k, v in vector.items()} for vector in vectors]
    merged = merge(operator, vectors, statistics=grams if operator == "regmean" else None)
    assert torch.isfinite(merged["w"]).all()
    assert all(torch.equal(v["w"], b["w"]) for v, b in zip(vectors, before))
    handed = [torch.ones(1), torch.zeros(1)]
    assert [float(t) for t in consume(handed)] == [1.0, 0.0] and handed == [None, None]


# PCB is elementwise too, but clamps each task's top 0.01 % of magnitudes, so it is not a multiple.
ELEMENTWISE = ["weight_averaging", "task_arithmetic", "ties", "dare", "consensus_ta"]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_operator_of_identical_vectors_is_a_multiple_of_them(name):
    vector = {"w": torch.randn(4, 4, generator=torch.Generator().manual_seed(1))}
    # DARE's masks differ per task by design; identical tasks are nowhere "task-specific" enough for TALL masks at
    # lambda 0.6 (|v| > 0.6 |3v - v| never holds).
    hyper = {"dare": {"drop_rate": 0.0}, "consensus_ta": {"tall_mask_lambda": 0.4}}
    merged = merge(name, [vector, vector, vector], **hyper.get(name, {}))["w"]
    assert (merged != 0).any()
    kept = merged != 0
    ratio = merged[kept] / vector["w"][kept]
    assert torch.allclose(ratio, ratio[0].expand_as(ratio))


def random_vectors(count=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        {"layer.weight": torch.randn(6, 5, generator=generator), "layer.bias": torch.randn(6, generator=generator),
         "norm.weight": torch.randn(6, generator=generator),
         "conv.weight": torch.randn(4, 3, 3, 3, generator=generator)}
        for _ in range(count)
    ]


CONFIGURATIONS = [
    ("weight_averaging", {}), ("task_arithmetic", {"scaling": 0.3}),
    ("ties", {"density": 0.2}), ("ties", {"density": 0.5, "topk_scope": "per_tensor", "merge_func": "sum"}),
    ("dare", {"drop_rate": 0.7, "seed": 3}), ("pcb", {}), ("pcb", {"ratio": 0.5, "scaling": 1.0}),
    ("wudi", {"iterations": 20, "lr": 1e-3}), ("tsv_m", {}), ("iso_c", {}), ("iso_cts", {}),
    ("iso_cts", {"common_space_fraction": 0.5}),
    ("ace", {}), ("ace", {"stage": 2, "prior": "mean_cov"}), ("consensus_ta", {}), ("regmean", {}),
    ("regmean", {"reduce_non_diagonal_ratio": 0.3}), ("fisher", {}), ("fisher", {"normalize_fisher_weight": False}),
    ("emr", {}), ("tall_masks", {}), ("dts", {}), ("dts", {"rank_fraction": 0.7, "include_conv": False}),
]


def random_statistics(name, vectors, seed=1):
    """Per-task Grams (PSD, for the matrix-shaped tensors) or positive Fisher diagonals (for every tensor)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for vector in vectors:
        stats = {}
        for key, value in vector.items():
            if name == "fisher":
                stats[key] = torch.rand(value.shape, generator=generator)
            elif value.ndim >= 2:
                inputs = torch.randn(20, value[0].numel(), generator=generator)
                stats[key] = inputs.T @ inputs / 20
        out.append(stats)
    return out


def test_every_registered_operator_is_covered_by_the_streaming_test():
    assert {name for name, _ in CONFIGURATIONS} == set(OPERATORS)


@pytest.mark.parametrize("name,hyper", CONFIGURATIONS)
def test_streamed_merge_from_files_is_bit_identical_to_in_memory(tmp_path, name, hyper):
    vectors = random_vectors()
    paths = []
    for i, vector in enumerate(vectors):
        paths.append(tmp_path / f"tv{i}.safetensors")
        save_tensors(paths[-1], vector, {"task": str(i)})
    statistics = random_statistics(name, vectors) if name in NEEDS_STATISTICS else None
    for kind in ("task",) if OPERATORS[name].task_vectors_only else ("task", "difference"):
        source = SafetensorsSource(paths, StatisticsSource(statistics) if statistics else None)
        streamed = dict(merge_stream(name, source, kind, **hyper))
        in_memory = merge(name, vectors, kind, statistics, **hyper)
        assert streamed.keys() == in_memory.keys()
        for key in in_memory:
            assert torch.equal(streamed[key], in_memory[key]), (kind, key)


def test_stream_reads_one_tensor_per_task_at_a_time():
    """No statistics pass: the per-tensor rule only ever sees the current tensor of each task."""
    vectors = random_vectors()
    reads = []

    class Recording(InMemorySource):
        def tensor(self, index, key):
            reads.append(key)
            return super().tensor(index, key)

    source = Recording(vectors)
    for key, _ in merge_stream("task_arithmetic", source):
        assert reads == [key] * len(vectors)  # read exactly now, just before its merged tensor is produced
        reads.clear()


def test_file_hash_streamed_equals_in_memory_hash(tmp_path):
    vector = random_vectors(1)[0]
    save_tensors(tmp_path / "v.safetensors", vector, {})
    assert file_tensors_sha256(tmp_path / "v.safetensors") == tensors_sha256(vector)


def test_dare_without_dropping_is_task_arithmetic():
    vectors = random_vectors()
    for key, value in dare(vectors, drop_rate=0.0, scaling=0.3).items():
        assert torch.equal(value, task_arithmetic(vectors, scaling=0.3)[key])


def test_dare_drops_about_p_and_rescales_survivors_exactly():
    vector = {"w": torch.randn(200, 50, generator=torch.Generator().manual_seed(0))}
    merged = dare([vector], drop_rate=0.9, scaling=1.0, seed=1)["w"]
    kept = merged != 0
    assert kept.float().mean().item() == pytest.approx(0.1, abs=0.01)
    assert torch.allclose(merged[kept], vector["w"][kept] / 0.1)
    # seeded: the same seed gives the same masks, another seed other masks
    assert torch.equal(merged, dare([vector], drop_rate=0.9, scaling=1.0, seed=1)["w"])
    assert not torch.equal(merged, dare([vector], drop_rate=0.9, scaling=1.0, seed=2)["w"])


def test_dare_masks_do_not_depend_on_which_tensors_are_merged_alongside():
    vectors = random_vectors()
    full = dare(vectors, drop_rate=0.5)
    only_bias = dare([{"layer.bias": v["layer.bias"]} for v in vectors], drop_rate=0.5)
    assert torch.equal(full["layer.bias"], only_bias["layer.bias"])


def test_dare_is_unbiased_over_seeds():
    vectors = random_vectors(2)
    mean = torch.stack([dare(vectors, drop_rate=0.5, scaling=1.0, seed=s)["layer.weight"] for s in range(400)]).mean(0)
    assert torch.allclose(mean, task_arithmetic(vectors, scaling=1.0)["layer.weight"], atol=0.25)


def test_bad_operator_hyperparameters_are_named():
    with pytest.raises(ValueError, match=r"dare drop_rate must be in \[0, 1\), got 1.0"):
        dare(random_vectors(), drop_rate=1.0)
    with pytest.raises(ValueError, match="ties density"):
        ties(random_vectors(), density=1.5)


@pytest.mark.parametrize("density", [0.0, 1e-3, 0.2, 0.5, 0.999, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_streamed_global_threshold_equals_kthvalue_over_the_concatenation(density, dtype):
    generator = torch.Generator().manual_seed(0)
    vector = {"a": torch.randn(300, 7, generator=generator).to(dtype),
              "b": torch.randint(-3, 4, (500,), generator=generator).to(dtype),  # many ties, zeros
              "c": 1e-30 * torch.randn(64, generator=generator).to(dtype)}
    flat = torch.cat([v.reshape(-1) for v in vector.values()]).to(torch.float32)
    expected = top_magnitude_threshold(flat, density)
    assert _ties_thresholds(InMemorySource([vector]), density, "global", "round") == [expected]
