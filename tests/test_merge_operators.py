"""The operators beyond averaging and TIES against hand-computable cases, their reference formulas and their
defining properties; the streamed order statistics they rely on against sorting."""

import pytest
import torch

from dpmerge.merge.data_based import weighted_times_pinv
from dpmerge.merge.matrices import mean_of, sum_of
from dpmerge.merge.order_statistics import streamed_order_statistics
from dpmerge.merge.personalized import dts_dequantize, dts_quantize
from dpmerge.merge.registry import (
    OPERATORS,
    consensus_ta,
    fisher,
    is_part,
    iso_c,
    iso_cts,
    merge,
    pcb,
    personal_vector,
    regmean,
    resolve_merge,
    task_arithmetic,
    tsv_m,
    weight_averaging,
    wudi,
)
from dpmerge.merge.spectral import wudi_solve


def randn(*shape, seed=0, scale=1.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("count", [1, 2, 3, 8, 13])
@pytest.mark.parametrize("shape", [(7,), (768,), (3, 50, 70), (100_003,)])
def test_sum_and_mean_without_a_stack_agree_with_the_stacks(count, shape):
    tensors = [randn(*shape, seed=seed, scale=10.0 ** (seed % 5 - 2)) for seed in range(count)]
    stacked = torch.stack(tensors)
    exact = stacked.double().sum(0)
    rounding = count * 2.0**-23 * stacked.double().abs().sum(0)  # float32 summation's error bound, per coordinate
    assert ((sum_of(tensors).double() - exact).abs() <= rounding).all()
    assert ((mean_of(tensors).double() - exact / count).abs() <= rounding / count).all()
    torch.testing.assert_close(mean_of(tensors), stacked.mean(0))
    assert torch.equal(tensors[0], randn(*shape, seed=0, scale=0.01))  # the inputs are left as they were


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_streamed_order_statistics_equal_sorting_signed_values_with_ties(dtype):
    chunks = [
        [randn(300, seed=1).to(dtype), torch.tensor([0.0, -0.0, 1.0, -1.0, 1.0, 3e-39, -3e-39], dtype=dtype)],
        [torch.randint(-3, 4, (500,), generator=torch.Generator().manual_seed(2)).to(dtype),
         -randn(40, seed=3).to(dtype)],
        [1e-30 * randn(64, seed=4).to(dtype), torch.full((5,), -7.5, dtype=dtype)],
    ]
    sequences = [torch.cat([c[s].reshape(-1) for c in chunks]).to(torch.float32) for s in range(2)]
    ranks = [[0, 1, 17, 431, 863], [0, 3, 20, 50, 51]]
    got = streamed_order_statistics(lambda: iter(chunks), ranks)
    for s, sequence in enumerate(sequences):
        ordered = sequence.sort().values
        assert got[s] == [float(ordered[r]) for r in ranks[s]]
    with pytest.raises(ValueError, match="rank 52 outside a sequence of 52 values"):
        streamed_order_statistics(lambda: iter(chunks), [[0], [52]])


# ---- PCB


def pcb_reference(vectors, ratio, scaling):
    """PCB_merge of the reference code on the flattened task vectors (sorting whole vectors)."""
    flat = torch.stack([torch.cat([v.reshape(-1) for v in vector.values()]) for vector in vectors])
    n, d = flat.shape

    def clamp(x, min_ratio, max_ratio):
        ordered = torch.sort(x, dim=1).values
        return torch.clamp(x, ordered[:, int(d * min_ratio)].unsqueeze(1),
                           ordered[:, int(d * (1 - max_ratio) - 1)].unsqueeze(1))

    def normalize(x):
        low, high = x.min(1, keepdim=True).values, x.max(1, keepdim=True).values
        return (x - low) / (high - low)

    magnitude = clamp(flat.abs(), 1e-4, 1e-4)
    clamped = torch.sign(flat) * magnitude
    score = torch.exp(n * normalize(magnitude) ** 2) * torch.tanh(flat * flat.sum(0))
    weight = normalize(clamp(score, 1 - ratio, 0))
    merged = scaling * (clamped * weight).sum(0) / weight.sum(0).clamp(min=1e-12)
    out, offset = {}, 0
    for key, value in vectors[0].items():
        out[key] = merged[offset:offset + value.numel()].reshape(value.shape)
        offset += value.numel()
    return out


@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.5])
def test_pcb_equals_the_reference_formula_on_the_flattened_vectors(ratio):
    vectors = [{"a": randn(40, 30, seed=s), "b": randn(500, seed=10 + s, scale=0.1), "c": randn(3, seed=20 + s)}
               for s in range(4)]
    merged = pcb(vectors, ratio=ratio, scaling=1.2)
    expected = pcb_reference(vectors, ratio, 1.2)
    for key in expected:
        assert torch.allclose(merged[key], expected[key], rtol=1e-5, atol=1e-7), key


def test_pcb_weights_only_the_top_ratio_of_balance_scores():
    vectors = [{"w": randn(1000, seed=s)} for s in range(3)]
    merged = pcb(vectors, ratio=0.1)["w"]
    # An entry keeps a non-zero weight in at most 10 % of positions per task: at most 30 % are non-zero.
    assert 0.1 <= (merged != 0).float().mean() <= 0.3


# ---- WUDI


def wudi_reference(matrices, iterations, lr):
    """The reference loop: autograd through the loss, Adam from the sum."""
    stacked = torch.stack(matrices)
    tau = torch.nn.Parameter(stacked.sum(0))
    optimizer = torch.optim.Adam([tau], lr=lr, weight_decay=0)
    norms = stacked.reshape(len(matrices), -1).norm(dim=-1).square()
    for _ in range(iterations):
        product = (tau.unsqueeze(0) - stacked) @ stacked.transpose(1, 2)
        loss = (product.square() / norms[:, None, None]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return tau.detach()


@pytest.mark.parametrize("shape", [(7, 5), (5, 9)])  # tall and wide: B is formed through the smaller Gram
def test_wudi_closed_form_steps_equal_autograd_on_the_loss(shape):
    matrices = [randn(*shape, seed=s, scale=0.01) for s in range(3)]
    merged, _ = wudi_solve(matrices, iterations=50, lr=1e-4)
    assert torch.allclose(merged, wudi_reference(matrices, 50, 1e-4), rtol=1e-4, atol=1e-7)


def test_wudis_adam_step_is_torch_optims_to_the_bit():
    from dpmerge.merge.spectral import _adam_step

    parameter = torch.nn.Parameter(randn(6, 4, seed=1))
    optimizer = torch.optim.Adam([parameter], lr=3e-3, weight_decay=0)
    ours = parameter.detach().clone()
    exp_avg, exp_avg_sq = torch.zeros_like(ours), torch.zeros_like(ours)
    for step in range(1, 8):
        grad = randn(6, 4, seed=10 + step)
        parameter.grad = grad.clone()
        optimizer.step()
        _adam_step(ours, grad, exp_avg, exp_avg_sq, step, 3e-3)
        assert torch.equal(ours, parameter.detach()), step


def test_wudi_loss_starts_at_the_sum_and_decreases():
    matrices = [randn(12, 9, seed=s) for s in range(4)]
    _, losses = wudi_solve(matrices, iterations=200, lr=1e-2)
    stacked = torch.stack(matrices)
    start = sum(((stacked.sum(0) - m) @ m.T).square().sum() / m.square().sum() for m in matrices)
    assert losses[0] == pytest.approx(float(start), rel=1e-4)
    assert losses[-1] < 0.5 * losses[0]
    assert all(later <= earlier * (1 + 1e-6) for earlier, later in zip(losses[:20], losses[1:21]))


def test_wudi_averages_non_matrices_is_deterministic_and_starts_from_the_sum():
    vectors = [{"w": randn(6, 4, seed=s), "b": randn(6, seed=10 + s), "conv": randn(3, 2, 2, 2, seed=20 + s)}
               for s in range(3)]
    merged = wudi(vectors)
    assert torch.equal(merged["b"], weight_averaging(vectors)["b"])
    assert torch.equal(merged["w"], wudi(vectors)["w"])
    unmoved = wudi(vectors, iterations=0)
    for key in ("w", "conv"):
        assert torch.equal(unmoved[key], task_arithmetic(vectors, scaling=1.0)[key])
    assert torch.equal(wudi(vectors, include_conv=False)["conv"], weight_averaging(vectors)["conv"])


# ---- TSV-M, Iso-C, Iso-CTS


def test_tsv_m_keeps_low_rank_tasks_in_orthogonal_subspaces_exactly():
    eye = torch.eye(6)
    # Each task has rank 3 = min(6, 6) / 2 tasks, in row and column spaces orthogonal to the other's.
    first = 3.0 * torch.outer(eye[0], eye[1]) + 1.0 * torch.outer(eye[2], eye[3]) + 2.0 * torch.outer(eye[1], eye[0])
    second = 2.0 * torch.outer(eye[4], eye[5]) - 0.5 * torch.outer(eye[3], eye[2]) + 1.5 * torch.outer(eye[5], eye[4])
    merged = tsv_m([{"w": first}, {"w": second}])["w"]
    assert torch.allclose(merged, first + second, atol=1e-6)


def test_tsv_m_truncates_each_task_to_its_share_of_the_rank():
    vectors = [{"w": randn(8, 8, seed=s)} for s in range(4)]  # rank 8, four tasks: two directions each
    merged = tsv_m(vectors)["w"]
    assert int(torch.linalg.matrix_rank(merged)) == 8
    singular = torch.linalg.svdvals(merged).sort().values
    kept = torch.cat([torch.linalg.svdvals(v["w"])[:2] for v in vectors]).sort().values
    assert torch.allclose(singular, kept, rtol=1e-4)  # orthogonalised: the kept singular values survive


def test_iso_c_by_hand_and_flat_spectrum():
    assert torch.allclose(iso_c([{"w": torch.diag(torch.tensor([3.0, 1.0]))}])["w"], 2.0 * torch.eye(2))
    vectors = [{"w": randn(9, 5, seed=s), "b": randn(9, seed=s)} for s in range(3)]
    merged = iso_c(vectors, scaling=1.5)
    summed = sum(v["w"] for v in vectors)
    singular = torch.linalg.svdvals(merged["w"])
    assert torch.allclose(singular, torch.full((5,), 1.5 * float(torch.linalg.svdvals(summed).mean())), rtol=1e-5)
    assert torch.allclose(merged["b"], 1.5 * weight_averaging(vectors)["b"])


def test_iso_cts_with_only_common_space_is_iso_c():
    vectors = [{"w": randn(9, 6, seed=s)} for s in range(3)]
    expected = iso_c(vectors)["w"]  # within float32 rounding: Iso-C's polar factor comes from a float32 Gram
    assert torch.allclose(iso_cts(vectors, common_space_fraction=1.0)["w"], expected,
                          atol=1e-6 * float(expected.abs().max()))
    merged = iso_cts(vectors)["w"]
    singular = torch.linalg.svdvals(merged)
    assert torch.allclose(singular, singular.mean().expand_as(singular), rtol=1e-4)  # isotropic, full rank


# ---- Consensus TA


def test_consensus_task_arithmetic_by_hand():
    vectors = [{"w": torch.tensor([1.0, 0.0, 2.0, 0.1])},
               {"w": torch.tensor([1.0, 3.0, -2.0, 0.0])},
               {"w": torch.tensor([1.0, 0.0, 0.0, 0.0])}]
    # sum = [3, 3, 0, 0.1]; task t selects j where |tau_t| > 0.5 |sum - tau_t|:
    # task 0: [1 > 1, 0 > 1.5, 2 > 1, 0.1 > 0] = [F, F, T, T]; task 1: [F, T, T, F]; task 2: [F, F, F, F]
    # -> agreement [0, 1, 2, 1]; k = 2 keeps only entry 2, whose sum is 0.
    merged = consensus_ta(vectors, scaling=1.0, tall_mask_lambda=0.5, min_agreement=2)["w"]
    assert torch.equal(merged, torch.tensor([0.0, 0.0, 0.0, 0.0]))
    merged = consensus_ta(vectors, scaling=1.0, tall_mask_lambda=0.5, min_agreement=1)["w"]
    assert torch.equal(merged, torch.tensor([0.0, 3.0, 0.0, 0.1]))
    assert torch.equal(consensus_ta(vectors, scaling=0.3, min_agreement=0)["w"], task_arithmetic(vectors)["w"])


# ---- difference vectors


def test_difference_vectors_of_averaging_and_task_arithmetic_are_the_average():
    vectors = [{"w": randn(5, 4, seed=s), "b": randn(5, seed=s)} for s in range(3)]
    average = weight_averaging(vectors)
    for name in ("weight_averaging", "task_arithmetic"):
        merged = merge(name, vectors, "difference")
        for key in average:
            assert torch.allclose(merged[key], average[key], atol=1e-6), (name, key)


@pytest.mark.parametrize("name", sorted(n for n, op in OPERATORS.items() if not op.task_vectors_only))
def test_difference_vectors_of_identical_tasks_return_that_task(name):
    vector = {"w": randn(5, 4, seed=1), "b": randn(5, seed=2)}
    statistics = {"regmean": [{"w": torch.eye(4)}] * 3, "fisher": [{"w": torch.ones(5, 4), "b": torch.ones(5)}] * 3}
    merged = merge(name, [vector, vector, vector], "difference", statistics.get(name))
    for key in vector:
        assert torch.allclose(merged[key], vector[key], atol=1e-6), key


def test_unknown_vector_kind_and_bad_hyperparameters_are_named():
    vectors = [{"w": randn(2, 2)}]
    with pytest.raises(ValueError, match="vectors must be one of task, difference, got 'deltas'"):
        merge("ties", vectors, "deltas")
    with pytest.raises(ValueError, match=r"pcb ratio must be in \(0, 1\], got 0"):
        pcb(vectors, ratio=0)
    with pytest.raises(ValueError, match="hyperparameter 'iterations' must be a whole number"):
        wudi(vectors, iterations=2.5)
    with pytest.raises(ValueError, match="wudi iterations must be a non-negative integer"):
        wudi(vectors, iterations=-1)
    with pytest.raises(ValueError, match="iso_cts common_space_fraction"):
        iso_cts(vectors, common_space_fraction=2)
    with pytest.raises(ValueError, match="'include_conv' must be true or false"):
        tsv_m(vectors, include_conv="yes")


# ---- RegMean and Fisher


def test_regmean_with_identity_or_equal_grams_is_averaging():
    vectors = [{"w": randn(5, 3, seed=s), "b": randn(5, seed=10 + s)} for s in range(3)]
    average = weight_averaging(vectors)
    identity = [{"w": torch.eye(3)} for _ in vectors]
    shared = randn(3, 3, seed=7)
    shared = [{"w": shared @ shared.T + torch.eye(3)} for _ in vectors]
    for grams in (identity, shared):
        merged = regmean(vectors, grams, reduce_non_diagonal_ratio=1.0)
        assert torch.allclose(merged["w"], average["w"], atol=1e-5)
        assert torch.equal(merged["b"], average["b"])  # not a linear weight: averaged


@pytest.mark.parametrize("case", ["definite", "singular", "indefinite", "nearly singular"])
def test_weighted_times_pinv_is_the_pseudo_inverse_whichever_path_it_takes(case):
    # Cholesky solves on safely definite matrices, an eigendecomposition otherwise; both must equal pinv
    factor = randn(6, 6, seed=1, scale=1.0).double()
    total = factor @ factor.T + torch.eye(6, dtype=torch.float64)
    if case == "singular":  # a dead input unit: zero row and column
        total[2, :] = total[:, 2] = 0
    elif case == "indefinite":  # privatized Grams: symmetric noise can make the sum indefinite
        total -= 3 * torch.eye(6, dtype=torch.float64) * total.diagonal().min()
    elif case == "nearly singular":  # definite, but an eigenvalue below pinv's cutoff
        eigenvalues, vectors = torch.linalg.eigh(total)
        eigenvalues[0] = 1e-18 * eigenvalues[-1]
        total = vectors @ torch.diag(eigenvalues) @ vectors.T
        total = (total + total.T) / 2
    weighted = randn(4, 6, seed=2).double()
    expected = weighted @ torch.linalg.pinv(total, hermitian=True)
    assert torch.allclose(weighted_times_pinv([weighted.clone(), total.clone()]), expected, atol=1e-8, rtol=1e-6)


def test_regmean_by_hand_each_task_owns_the_inputs_it_saw():
    first, second = {"w": torch.tensor([[1.0, 2.0]])}, {"w": torch.tensor([[3.0, 4.0]])}
    # task 1 only ever saw input direction e0, task 2 only e1: the merge takes column 0 from task 1, 1 from 2
    grams = [{"w": torch.diag(torch.tensor([2.0, 0.0]))}, {"w": torch.diag(torch.tensor([0.0, 5.0]))}]
    assert torch.allclose(regmean([first, second], grams, reduce_non_diagonal_ratio=1.0)["w"],
                          torch.tensor([[1.0, 4.0]]))
    # and it is the least-squares solution on both tasks' inputs in general
    vectors = [{"w": randn(4, 3, seed=s)} for s in range(2)]
    inputs = [randn(10, 3, seed=20 + s) for s in range(2)]
    grams = [{"w": x.T @ x} for x in inputs]
    stacked_inputs = torch.cat(inputs)
    targets = torch.cat([x @ v["w"].T for x, v in zip(inputs, vectors)])
    least_squares = torch.linalg.lstsq(stacked_inputs, targets).solution.T
    assert torch.allclose(regmean(vectors, grams, reduce_non_diagonal_ratio=1.0)["w"], least_squares, atol=1e-4)


def test_fisher_merging_by_hand():
    vectors = [{"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([3.0, -1.0])}]
    fishers = [{"w": torch.tensor([3.0, 0.0])}, {"w": torch.tensor([1.0, 0.0])}]
    merged = fisher(vectors, fishers, normalize_fisher_weight=False, minimal_fisher_weight=0.0)["w"][0]
    assert merged == pytest.approx((3 * 1 + 1 * 3) / 4)
    # no task informs coordinate 1: the minimal weight makes it the plain average
    assert fisher(vectors, fishers, normalize_fisher_weight=False)["w"][1] == pytest.approx(0.0, abs=1e-6)
    equal = [{"w": torch.ones(2)} for _ in vectors]
    assert torch.allclose(fisher(vectors, equal)["w"], weight_averaging(vectors)["w"])


def test_statistics_operators_refuse_to_run_without_statistics():
    with pytest.raises(ValueError, match="regmean needs per-task Gram matrices"):
        merge("regmean", [{"w": randn(2, 2)}])
    with pytest.raises(ValueError, match="fisher: the Fisher statistics lack tensors the task vectors have: \\['b'\\]"):
        fisher([{"w": randn(2), "b": randn(2)}], [{"w": torch.ones(2)}])


# ---- personalized merges: EMR, TALL masks, DTS


def task_models(name, vectors, vectors_kind="task", **hyper):
    stored = merge(name, vectors, vectors_kind, **hyper)
    shared = {k: v for k, v in stored.items() if not is_part(k)}
    parts = {k: v for k, v in stored.items() if is_part(k)}
    return [personal_vector(name, shared, parts, t, **hyper) for t in range(len(vectors))]


def test_emr_by_hand():
    vectors = [{"w": torch.tensor([1.0, -2.0, 0.5])}, {"w": torch.tensor([2.0, 1.0, -1.0])}]
    # sum [3, -1, -0.5] elects signs [+, -, -]; largest agreeing magnitudes give tau_uni = [2, -2, -1];
    # masks [1, 1, 0] and [1, 0, 1]; rescalers 3.5 / 4 and 4 / 3
    first, second = task_models("emr", vectors)
    assert torch.allclose(first["w"], 0.875 * torch.tensor([2.0, -2.0, 0.0]))
    assert torch.allclose(second["w"], 4 / 3 * torch.tensor([2.0, 0.0, -1.0]))


def test_tall_masks_give_each_task_the_sum_where_its_own_update_dominates():
    vectors = [{"w": torch.tensor([1.0, 0.0, 2.0, 0.1])}, {"w": torch.tensor([1.0, 3.0, -2.0, 0.0])}]
    first, second = task_models("tall_masks", vectors, tall_mask_lambda=0.5)
    # sum [2, 3, 0, 0.1]; task 0 keeps j where |tau_0| > 0.5 |sum - tau_0| = [0.5, 1.5, 1, 0]: [T, F, T, T]
    assert torch.equal(first["w"], torch.tensor([2.0, 0.0, 0.0, 0.1]))
    assert torch.equal(second["w"], torch.tensor([2.0, 3.0, 0.0, 0.0]))


def test_dts_quantization_by_hand():
    codes, scales = dts_quantize(torch.tensor([8.0, 3.0, 10.0, 2.0, -1.0, -5.0]))
    # positives split at their median 3: large {8, 10} -> 9, small {3, 2} -> 2.5; negatives at 1: {5}, {1}
    assert torch.equal(dts_dequantize(codes, scales), torch.tensor([9.0, 2.5, 9.0, 2.5, -1.0, -5.0]))
    assert codes.max() <= 3  # two bits


def test_dts_reconstruction_error_falls_as_the_rank_fraction_grows():
    full_rank = randn(40, 30, seed=5)
    low_rank = randn(40, 6, seed=1) @ randn(6, 30, seed=2) + 0.05 * randn(40, 30, seed=3)
    vectors = [{"w": full_rank, "b": randn(40, seed=4)}, {"w": low_rank, "b": randn(40, seed=6)}]
    errors = {0: [], 1: []}
    for fraction in (0.05, 0.2, 0.5, 1.0):
        models = task_models("dts", vectors, rank_fraction=fraction)
        for t in (0, 1):
            errors[t].append(float((models[t]["w"] - vectors[t]["w"]).norm() / vectors[t]["w"].norm()))
    assert all(later < earlier for earlier, later in zip(errors[0], errors[0][1:])), errors[0]
    # rank 6 of 30 holds the low-rank task's signal: beyond r = 0.2 only 2-bit coding error remains
    assert errors[1][1] < 0.55 and errors[1][1] < errors[1][0]


def test_dts_on_difference_vectors_rebuilds_around_the_average():
    vectors = [{"w": randn(6, 5, seed=s)} for s in range(3)]
    average = weight_averaging(vectors)["w"]
    exact = task_models("dts", vectors, "difference", rank_fraction=1.0)
    for vector, model in zip(vectors, exact):
        # the reference is the average; the residual is approximated (2-bit singular vectors)
        assert (model["w"] - vector["w"]).norm() < (average - vector["w"]).norm()


def test_personalized_storage_per_task_is_counted_in_bits():
    # a 100 x 100 weight at r = 0.3: 30 singular values (32 bits), 2-bit codes for 100 x 30 + 30 x 100 entries,
    # and 2 x 4 group scales
    assert resolve_merge("dts", rank_fraction=0.3).part_bits((100, 100), torch.float32) == 2 * 6000 + 32 * 30 + 32 * 8
    assert resolve_merge("emr").part_bits((100, 100), torch.float32) == 10_000 + 32  # a 1-bit mask and the rescaler
    with pytest.raises(ValueError, match="emr is defined on task vectors only"):
        merge("emr", [{"w": randn(2)}], "difference")


def test_statistics_of_the_wrong_shape_or_count_are_named():
    vectors = [{"w": randn(4, 3, seed=s)} for s in range(2)]
    with pytest.raises(ValueError,
                       match=r"statistics of task 1: Gram of 'w' has shape \(4, 4\), the weight needs \(3, 3\)"):
        regmean(vectors, [{"w": torch.eye(3)}, {"w": torch.eye(4)}])
    with pytest.raises(ValueError, match="regmean: 1 tasks' Gram matrices for 2 task vectors"):
        regmean(vectors, [{"w": torch.eye(3)}])
    with pytest.raises(ValueError, match=r"Fisher of 'w' has shape \(3, 4\)"):
        fisher(vectors, [{"w": torch.ones(4, 3)}, {"w": torch.ones(3, 4)}])


def test_streamed_order_statistics_are_exact_across_pieces(monkeypatch):
    import dpmerge.merge.order_statistics as order_statistics

    monkeypatch.setattr(order_statistics, "_PIECE", 7)  # every tensor split into many pieces
    values = [randn(100, seed=5), randn(33, seed=6)]
    ordered = torch.cat(values).sort().values
    got = streamed_order_statistics(lambda: iter([[v] for v in values]), [[0, 50, 132]])
    assert got == [[float(ordered[r]) for r in (0, 50, 132)]]


# ---- the spec table: defaults stated once, each with its implementation


def test_every_spec_has_an_implementation_and_every_implementation_a_spec():
    import inspect

    from dpmerge.merge.registry import FAMILIES
    from dpmerge.merge.specs import NEEDS_STATISTICS, SPECS
    from dpmerge.privacy.statistics import KINDS

    families = [family.IMPLEMENTATIONS for family in FAMILIES]
    implemented = [name for family in families for name in family]
    assert len(implemented) == len(set(implemented))  # no operator implemented twice
    assert set(implemented) == set(SPECS)
    assert list(OPERATORS) == list(SPECS)
    for name, spec in SPECS.items():
        operator = OPERATORS[name]
        assert spec.name == name and operator.spec is spec
        assert operator.defaults is spec.defaults and operator.task_vectors_only == spec.task_vectors_only
        assert spec.personalized == (operator.parts_layout is not None) == (operator.reconstruct is not None)
        # the per-tensor rule takes (key, tensors, stats) and then exactly the spec's hyperparameters
        parameters = list(inspect.signature(operator.per_tensor).parameters)[3:]
        assert set(parameters) == set(spec.defaults), name
        assert (spec.statistic is None) == (name not in NEEDS_STATISTICS)
        if spec.statistic is not None:
            assert spec.statistic in KINDS and operator.statistics is not None
        assert spec.title in spec.description and f"arXiv {spec.arxiv}" in spec.description
        assert spec.arxiv.count(".") == 1 and all(part.isdigit() for part in spec.arxiv.split("."))


def test_schema_defaults_agree_with_the_spec_table():
    from pathlib import Path

    import yaml

    from dpmerge.merge.specs import SPECS, VECTOR_KINDS

    schema = yaml.safe_load((Path(__file__).parents[1] / "workflow/schemas/config.schema.yaml").read_text())
    merge_schema = schema["properties"]["merge"]
    entry = merge_schema["additionalProperties"]["properties"]
    assert "enum" not in entry["operator"]  # the config check reads merge/specs.py: a new operator needs no edit
    assert entry["vectors"]["enum"] == list(VECTOR_KINDS)
    for name, settings in merge_schema["default"].items():
        spec = SPECS[settings.get("operator", name)]
        hyperparameters = {k: v for k, v in settings.items() if k not in ("operator", "vectors", "statistics")}
        assert set(hyperparameters) <= set(spec.defaults), name
        assert hyperparameters == {k: spec.defaults[k] for k in hyperparameters}, name



def _doc_value(text: str):
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def test_the_operator_table_in_the_docs_agrees_with_the_spec_table():
    """docs/merge-operators.md lists every operator once, in the spec table's order, with its paper and its
    defaults as merge/specs.py states them: a new or changed operator that the docs miss fails here."""
    from pathlib import Path

    from dpmerge.merge.specs import SPECS

    text = (Path(__file__).parents[1] / "docs/merge-operators.md").read_text()
    start = text.index("| operator | paper (title, arXiv) | defaults | data | result |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert [row[0].strip("`") for row in rows] == list(SPECS)
    by_name = {row[0].strip("`"): row for row in rows}
    for name, spec in SPECS.items():
        _, paper, defaults, _, result = by_name[name]
        if paper.startswith("the same paper as "):
            same = [other for other in SPECS.values() if other.arxiv == spec.arxiv and other.name != name]
            assert same, name
        else:
            assert spec.title in paper and f"arXiv {spec.arxiv}" in paper, name
        documented = {} if defaults == "–" else {
            item.split("`")[1]: _doc_value(item.split("`")[2]) for item in defaults.split(", ")}
        assert documented == spec.defaults, name
        assert ("one model per task" in result) == spec.personalized, name

def test_the_spec_table_imports_neither_torch_nor_numpy():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "workflow")}
    probe = ("import sys, dpmerge.merge.specs as specs; assert specs.SPECS; "
             "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_operator_with_one_merged_vector_has_its_one_call_by_name():
    """merge/registry.py gives each one-call function (ties(task_vectors, density=0.5), ...) as a module attribute,
    listed by dir() too, and no other name."""
    import dpmerge.merge.registry as registry

    assert all(getattr(registry, name) is call for name, call in registry.ONE_CALL.items())
    assert set(registry.ONE_CALL) <= set(dir(registry))
    with pytest.raises(AttributeError, match="has no attribute 'tie'"):
        registry.tie  # noqa: B018
