"""The spectral merges' singular triplets and polar factors through the float64 Gram (merge/singular.py): equal
to the SVD's where the matrix is well conditioned, the SVD itself where it is not."""

from __future__ import annotations

import pytest
import torch

from dpmerge.merge import singular
from dpmerge.merge.singular import polar_and_spectrum, thin_svd, top_singular


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def decaying(rows, cols, seed=0, decay=1.0):
    """A matrix with singular values 1, 2^-decay, 3^-decay, ...: a fine-tuning update's spectrum, not noise's."""
    generator = torch.Generator().manual_seed(seed)
    width = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, width, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, width, generator=generator, dtype=torch.float64))
    s = torch.arange(1, width + 1, dtype=torch.float64) ** -decay
    return ((u * s) @ v.T).float()


def aligned(u, vh, u_ref, vh_ref):
    signs = torch.sign((u * u_ref).sum(0))
    return u * signs, signs[:, None] * vh


@pytest.mark.parametrize("shape", [(60, 20), (20, 60), (30, 30)])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_top_singular_is_the_svds_first_k_triplets(shape, k):
    matrix = decaying(*shape, seed=k)
    u, s, vh = top_singular(matrix, k)
    u_ref, s_ref, vh_ref = torch.linalg.svd(matrix.double(), full_matrices=False)
    assert u.dtype == s.dtype == vh.dtype == torch.float32
    assert u.shape == (shape[0], k) and s.shape == (k,) and vh.shape == (k, shape[1])
    assert torch.allclose(s.double(), s_ref[:k], rtol=1e-6, atol=0)
    u, vh = aligned(u.double(), vh.double(), u_ref[:, :k], vh_ref[:k])
    assert torch.allclose(u, u_ref[:, :k], atol=1e-5) and torch.allclose(vh, vh_ref[:k], atol=1e-5)


@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (16, 16)])
def test_polar_and_spectrum_equal_the_svds(shape):
    matrix = randn(*shape, seed=4)
    orthogonal, s = polar_and_spectrum(matrix)
    u, s_ref, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    assert orthogonal.dtype == torch.float32 and orthogonal.shape == matrix.shape
    assert torch.allclose(orthogonal.double(), u @ vh, atol=1e-5)
    assert torch.allclose(s.double(), s_ref, rtol=1e-5)


def test_ill_conditioned_or_zero_matrices_are_the_svds_to_the_last_bit():
    low_rank = randn(30, 3, seed=1) @ randn(3, 20, seed=2)  # sigma_4.. ~ 0: the Gram cannot resolve them
    for matrix, k in ((low_rank, 5), (torch.zeros(30, 20), 2), (low_rank.T.contiguous(), 4)):
        u, s, vh = thin_svd(matrix)
        got = top_singular(matrix, k)
        assert all(torch.equal(a, b) for a, b in zip(got, (u[:, :k], s[:k], vh[:k])))
        orthogonal, spectrum = polar_and_spectrum(matrix)
        assert torch.equal(orthogonal, u @ vh) and torch.equal(spectrum, s)
    # well conditioned in its top k: the Gram route, though the whole matrix is singular
    u, s, vh = top_singular(low_rank, 3)
    assert torch.allclose((u * s) @ vh, low_rank, atol=1e-5 * float(low_rank.abs().max()))


def test_no_directions_asked_for():
    u, s, vh = top_singular(randn(5, 4), 0)
    assert u.shape == (5, 0) and s.shape == (0,) and vh.shape == (0, 4)


@pytest.mark.parametrize("shape", [(6, 20), (20, 6), (7, 7)])
def test_thin_svd_is_torchs_svd_up_to_the_sign_of_each_pair(shape):
    matrix = randn(*shape, seed=3)
    u, s, vh = thin_svd(matrix)
    u_ref, s_ref, vh_ref = torch.linalg.svd(matrix, full_matrices=False)
    assert u.shape == u_ref.shape and vh.shape == vh_ref.shape
    assert torch.allclose(s, s_ref, rtol=1e-5)
    u, vh = aligned(u, vh, u_ref, vh_ref)
    assert torch.allclose(u, u_ref, atol=1e-5) and torch.allclose(vh, vh_ref, atol=1e-5)


@pytest.mark.parametrize("operator", ["tsv_m", "iso_c", "iso_cts"])
def test_spectral_merges_through_the_gram_equal_those_through_the_svd(operator, monkeypatch):
    """Both condition limits at 1 send every matrix to the SVD: the merges as computed before the Gram route."""
    from dpmerge.merge.registry import merge

    vectors = [{"wide": randn(12, 40, seed=s), "tall": randn(40, 12, seed=10 + s),
                "spectrum": decaying(48, 32, seed=20 + s)} for s in range(4)]
    fast = merge(operator, vectors)
    monkeypatch.setattr(singular, "CONDITION_LIMIT", 1.0)
    monkeypatch.setattr(singular, "FLOAT32_CONDITION_LIMIT", 1.0)
    plain = merge(operator, vectors)
    for name in fast:
        assert not torch.equal(fast[name], plain[name]), f"{name}: the Gram route was not taken"
        assert torch.allclose(fast[name], plain[name], atol=1e-5 * float(plain[name].abs().max())), name


def test_tsv_m_through_the_gram_is_as_exact_as_through_the_svd(monkeypatch):
    """Against the reference's algorithm in float64: the Gram route loses no accuracy to float32's SVD."""
    from dpmerge.merge.registry import merge
    from reference_merges import tsvm_reference

    vectors = [{"w": decaying(96, 64, seed=s, decay=0.5)} for s in range(4)]
    exact = tsvm_reference([{"w": v["w"].double()} for v in vectors])["w"]
    fast = merge("tsv_m", vectors)["w"].double()
    monkeypatch.setattr(singular, "CONDITION_LIMIT", 1.0)
    monkeypatch.setattr(singular, "FLOAT32_CONDITION_LIMIT", 1.0)
    plain = merge("tsv_m", vectors)["w"].double()
    largest = float(exact.abs().max())
    fast_error, plain_error = float((fast - exact).abs().max()), float((plain - exact).abs().max())
    assert fast_error <= max(plain_error, 1e-6 * largest), (fast_error, plain_error)


def spectrum_half_at(rows, cols, kappa, seed=0):
    """Half the singular values 1, half 1/kappa: the float32 Gram's worst case for the polar factor measured."""
    generator = torch.Generator().manual_seed(seed)
    width = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, width, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, width, generator=generator, dtype=torch.float64))
    s = torch.ones(width, dtype=torch.float64)
    s[width // 2:] = 1 / kappa
    return ((u * s) @ v.T).float()


@pytest.mark.parametrize("shape", [(1536, 384), (384, 1536), (384, 384)])
def test_the_float32_polar_is_within_1e5_at_its_condition_limit(shape, monkeypatch):
    """At FLOAT32_CONDITION_LIMIT on the worst spectrum measured, the float32 Gram's polar factor and spectrum
    are within 1e-5 of the exact ones; just past the limit the float64 route is taken instead."""
    limit = singular.FLOAT32_CONDITION_LIMIT
    matrix = spectrum_half_at(*shape, kappa=limit * 0.999)
    u, s_exact, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    exact = u @ vh
    orthogonal, s = polar_and_spectrum(matrix)
    assert float((orthogonal.double() - exact).abs().max()) <= 1e-5 * float(exact.abs().max())
    assert torch.allclose(s.double(), s_exact, rtol=1e-5)
    monkeypatch.setattr(singular, "FLOAT32_CONDITION_LIMIT", 1.0)
    in_float64, _ = polar_and_spectrum(matrix)
    assert not torch.equal(orthogonal, in_float64), "the float32 route was not taken below its limit"
    past = spectrum_half_at(*shape, kappa=limit * 1.01)
    monkeypatch.setattr(singular, "FLOAT32_CONDITION_LIMIT", limit)
    taken, _ = polar_and_spectrum(past)
    monkeypatch.setattr(singular, "FLOAT32_CONDITION_LIMIT", 1.0)
    assert torch.equal(taken, polar_and_spectrum(past)[0]), "past the float32 limit, not float64's"


def test_a_float64_matrix_is_never_taken_through_float32():
    matrix = spectrum_half_at(200, 50, kappa=2).double()
    orthogonal, _ = polar_and_spectrum(matrix)
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    assert orthogonal.dtype == torch.float64
    assert float((orthogonal - u @ vh).abs().max()) < 1e-12


def noise_like(rows, cols, seed=0):
    """What a DP task vector mostly is: Gaussian noise, whose top singular values crowd together (sigma_96 /
    sigma_97 ~ 1.001 at 3072 x 768), so which directions make the top k hangs on tiny gaps."""
    return 1e-3 * randn(rows, cols, seed=seed)


@pytest.mark.parametrize("shape, k", [((600, 150), 25), ((150, 600), 25), ((300, 300), 10)])
def test_the_float32_eigenvectors_refined_in_float64_give_float64s_top_k(shape, k, monkeypatch):
    matrix = noise_like(*shape, seed=k)
    tall = matrix if shape[0] >= shape[1] else matrix.T
    assert singular._top_refined(tall, k) is not None, "the refinement was not taken"
    refined = top_singular(matrix, k)
    monkeypatch.setattr(singular, "RITZ_SHARE", 0.0)  # every top k through the float64 Gram
    exact = top_singular(matrix, k)
    assert not all(torch.equal(a, b) for a, b in zip(refined, exact))
    largest = float(matrix.abs().max())
    truncated = (refined[0] * refined[1]) @ refined[2]
    assert float((truncated - (exact[0] * exact[1]) @ exact[2]).abs().max()) <= 1e-5 * largest
    assert torch.allclose(refined[1], exact[1], rtol=1e-6)


def test_without_a_gap_within_reach_the_top_k_is_float64s():
    """All singular values equal but one: no RITZ_GAP below sigma_k short of the whole width, so no refinement."""
    generator = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(120, 40, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(40, 40, generator=generator, dtype=torch.float64))
    s = torch.ones(40, dtype=torch.float64)
    s[0] = 2.0
    matrix = ((u * s) @ v.T).float()
    assert singular._top_refined(matrix, 3) is None
    got = top_singular(matrix, 3)
    assert got[0].shape == (120, 3) and torch.allclose(got[1], torch.tensor([2.0, 1.0, 1.0]), rtol=1e-6)


def test_a_float64_matrix_is_never_refined_from_float32(monkeypatch):
    monkeypatch.setattr(singular, "_top_refined", lambda *args: pytest.fail("float64 input went through float32"))
    u, s, vh = top_singular(noise_like(80, 30).double(), 4)
    assert u.dtype == s.dtype == vh.dtype == torch.float64


@pytest.mark.parametrize("kappa", [1.5, 3.0, 3.99])
def test_the_cholesky_precheck_never_turns_away_a_matrix_within_the_limit(kappa):
    """Its test is a bound (a triangular factor's diagonal lies within its singular values), not a guess."""
    for seed, shape in enumerate([(200, 50), (64, 64), (500, 20)]):
        matrix = spectrum_half_at(*shape, kappa=kappa, seed=seed)
        assert not singular._surely_past(singular._gram(matrix), singular.FLOAT32_CONDITION_LIMIT)


def test_the_cholesky_precheck_turns_away_tsv_ms_ill_conditioned_stacks():
    """A stack of nearly dependent directions (TSV-M's stacked right singular vectors at kappa ~ 1e3) is sent
    to float64 without a float32 eigendecomposition."""
    stacked = noise_like(64, 64, seed=5)
    stacked[:, -1] = stacked[:, 0] + 1e-5 * stacked[:, 1]
    assert singular._surely_past(singular._gram(stacked), singular.FLOAT32_CONDITION_LIMIT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gram_is_the_product_whatever_the_memory_layout(dtype):
    base = randn(90, 30, seed=7).to(dtype)
    layouts = {"row-major": base, "column-major": base.T.contiguous().T,
               "strided": randn(180, 30, seed=7).to(dtype)[::2]}
    for name, tall in layouts.items():
        gram = singular._gram(tall)
        expected = tall.double().T @ tall.double()
        assert gram.dtype == dtype and gram.shape == (30, 30), name
        tolerance = 1e-4 if dtype == torch.float32 else 1e-12
        largest = float(expected.abs().max())
        assert torch.allclose(torch.triu(gram).double(), torch.triu(expected), atol=tolerance * largest), name
