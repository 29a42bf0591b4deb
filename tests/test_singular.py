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
    """CONDITION_LIMIT = 1 sends every matrix to the SVD: the merges as they were computed before the Gram route."""
    from dpmerge.merge.registry import merge

    vectors = [{"wide": randn(12, 40, seed=s), "tall": randn(40, 12, seed=10 + s),
                "spectrum": decaying(48, 32, seed=20 + s)} for s in range(4)]
    fast = merge(operator, vectors)
    monkeypatch.setattr(singular, "CONDITION_LIMIT", 1.0)
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
    plain = merge("tsv_m", vectors)["w"].double()
    largest = float(exact.abs().max())
    fast_error, plain_error = float((fast - exact).abs().max()), float((plain - exact).abs().max())
    assert fast_error <= max(plain_error, 1e-6 * largest), (fast_error, plain_error)
