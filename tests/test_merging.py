"""Merge operators on hand-computable task vectors and against their defining properties."""

import pytest
import torch

from dpmerge.merging import OPERATORS, merge, task_arithmetic, ties, weight_averaging


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
    with pytest.raises(ValueError, match="known operators: task_arithmetic, ties, weight_averaging"):
        merge("nope", [tv(a=[1.0])])
    with pytest.raises(ValueError, match="allowed: scaling"):
        merge("task_arithmetic", [tv(a=[1.0])], density=0.1)


def test_mismatched_task_vectors_are_refused():
    with pytest.raises(ValueError, match="different parameters"):
        weight_averaging([tv(a=[1.0]), tv(b=[1.0])])
    with pytest.raises(ValueError, match="shape"):
        weight_averaging([tv(a=[1.0]), tv(a=[1.0, 2.0])])


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_of_identical_vectors_is_a_multiple_of_them(name):
    vector = {"w": torch.randn(4, 4, generator=torch.Generator().manual_seed(1))}
    merged = merge(name, [vector, vector, vector])["w"]
    kept = merged != 0
    ratio = merged[kept] / vector["w"][kept]
    assert torch.allclose(ratio, ratio[0].expand_as(ratio))
