"""Singular triplets and polar factors for the spectral merges, from the smaller Gram matrix where that is exact.

TSV-M keeps each task's top 1/T singular triplets and orthogonalises them; Iso-C and Iso-CTS need a polar factor
and a spectrum. A full float32 SVD (torch's divide and conquer) of a 3072 x 768 matrix costs 184 ms here; the
Gram's upper triangle (3/4 of a product's flops) and its symmetric eigendecomposition cost 15 + 30 ms in float32,
30 + 61 ms in float64. Precision follows what each result is sensitive to:
- top_singular: which directions make the top k hangs on the gap sigma_k - sigma_k+1, ~1e-3 sigma_1 for
  noise-like (DP) task vectors, where a float32 Gram alone moves the merge by ~1e-5. So the float32
  eigenvectors of the top k and of every direction within RITZ_GAP of them are refined by Rayleigh-Ritz in
  float64 (a QR and a product with the matrix): the split is float64's, the error ~2^-24 / RITZ_GAP.
- polar_and_spectrum: A (A^T A)^(-1/2) from a float32 Gram errs by about 1.5e-6 + 4 u kappa^2 of its largest
  entry (u = 2^-24; measured up to 6144 x 1536 on the worst spectrum, half the singular values at 1/kappa:
  3.8e-6 at kappa = 4), so up to FLOAT32_CONDITION_LIMIT it is float32's, above it float64's.
Against fusion_bench's algorithm in float64 the merges stay 2-50x closer than fusion_bench's own float32 SVDs
(bench/spectral_compute.py). The Gram squares the condition number, so where the singular values used span
more than CONDITION_LIMIT (or a matrix is zero) these fall back to the SVD itself, and a merge of such matrices
is the SVD's to the last bit."""

from __future__ import annotations

import torch

# sigma_max / sigma_min above which the Gram route's float64 error (~1e-16 x condition^2) could reach 1e-8.
CONDITION_LIMIT = 1e4
# sigma_max / sigma_min up to which a float32 Gram's polar factor is within 1e-5 of the float64 one (see above).
FLOAT32_CONDITION_LIMIT = 4.0
# top_singular refines float32 eigenvectors in float64 where the top k eigenvalues of the Gram stand at least
# RITZ_GAP x the largest above every direction left out of the refinement: the refined triplets then err by about
# 2^-24 / RITZ_GAP ~ 1e-6 of the largest (the float32 subspace's error toward the left-out directions), and the
# split between sigma_k and sigma_k+1, however close, is float64's. Beyond RITZ_SHARE of the width refined, the
# float64 Gram is cheaper.
RITZ_GAP = 0.06
RITZ_SHARE = 1 / 3


def _as_tall(matrix: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    wide = matrix.shape[0] < matrix.shape[1]
    return (matrix.T if wide else matrix).to(dtype), wide


def _gram(tall: torch.Tensor) -> torch.Tensor:
    """tall^T tall's upper triangle (the lower left block zero; eigh reads UPLO='U'), in three quarters of a full
    product's flops: [X1 X2]^T [X1 X2] as X1^T [X1 X2] and X2^T X2. (BLAS syrk would halve them, but scipy's
    OpenBLAS competes with torch's spinning OpenMP threads and ran no faster than torch's full product here.)"""
    width = tall.shape[1]
    half = width // 2
    gram = tall.new_zeros(width, width)
    torch.matmul(tall[:, :half].T, tall, out=gram[:half])
    torch.matmul(tall[:, half:].T, tall[:, half:], out=gram[half:, half:])
    return gram


def thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.linalg.svd(matrix, full_matrices=False), from the transpose where the matrix is wider than tall.
    On CPU, torch's divide-and-conquer SVD of a wide matrix (ViT's fc2, 768 x 3072) is slower than of its
    transpose; the factors are the same up to the sign of each singular pair, which none of TSV-M, Iso-C or
    Iso-CTS depends on (DTS quantizes the factors themselves, so it keeps torch's own signs)."""
    if matrix.shape[0] >= matrix.shape[1]:
        return torch.linalg.svd(matrix, full_matrices=False)
    v, s, uh = torch.linalg.svd(matrix.T, full_matrices=False)
    return uh.T, s, v.T


def _well_conditioned(largest: torch.Tensor, smallest: torch.Tensor, limit: float) -> bool:
    """Do the Gram eigenvalues `largest`..`smallest` span at most limit^2 (singular values at most limit)?"""
    return bool(largest > 0) and bool(smallest * limit**2 >= largest)


def _top_refined(tall: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The Gram's top k eigenvalues (ascending), eigenvectors and tall @ eigenvectors, float64, from the float32
    Gram's eigenvectors refined by Rayleigh-Ritz in float64; None where the top k are not RITZ_GAP apart from
    the rest within RITZ_SHARE of the width."""
    width = tall.shape[1]
    if k > width * RITZ_SHARE:  # more than the refinement may take, whatever the spectrum
        return None
    eigenvalues, eigenvectors = torch.linalg.eigh(_gram(tall.float()), UPLO="U")
    largest = eigenvalues[-1]
    kept = int((eigenvalues > eigenvalues[-k] - RITZ_GAP * largest).sum())  # the left-out ones sit RITZ_GAP below
    if not largest > 0 or kept > width * RITZ_SHARE:
        return None
    basis, _ = torch.linalg.qr(eigenvectors[:, width - kept:].to(torch.float64))
    image = tall.to(torch.float64) @ basis
    ritz_values, ritz_vectors = torch.linalg.eigh(image.T @ image)
    top = ritz_vectors[:, kept - k:]
    return ritz_values[kept - k:], basis @ top, image @ top


def top_singular(matrix: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k largest singular triplets of a float32 matrix: u (out x k), s (k), vh (k x in), as thin_svd's first k.

    Through the eigendecomposition of the smaller Gram, u = A v / s: float32's refined in float64 where the
    top k stand apart (_top_refined), else float64's; where sigma_k < sigma_1 / CONDITION_LIMIT that would lose
    digits, so it is thin_svd's."""
    if k == 0:
        return matrix.new_zeros(matrix.shape[0], 0), matrix.new_zeros(0), matrix.new_zeros(0, matrix.shape[1])
    tall, wide = _as_tall(matrix, matrix.dtype)
    refined = _top_refined(tall, k) if matrix.dtype == torch.float32 else None
    if refined is None:
        tall = tall.to(torch.float64)
        eigenvalues, eigenvectors = torch.linalg.eigh(_gram(tall), UPLO="U")
        eigenvalues, v = eigenvalues[-k:], eigenvectors[:, -k:]
        image = tall @ v
    else:
        eigenvalues, v, image = refined
    if not _well_conditioned(eigenvalues[-1], eigenvalues[0], CONDITION_LIMIT):
        u, s, vh = thin_svd(matrix)
        return u[:, :k], s[:k], vh[:k]
    s = eigenvalues.flip(0).sqrt()
    u = image.flip(1) / s
    u, s, v = u.to(matrix.dtype), s.to(matrix.dtype), v.flip(1).to(matrix.dtype)
    return (v, s, u.T) if wide else (u, s, v.T)


def _surely_past(gram: torch.Tensor, limit: float) -> bool:
    """Does the Gram's Cholesky factor already show singular values spanning more than `limit`? A triangular
    factor's diagonal lies within its singular values, so max R_ii / min R_ii <= sigma_max / sigma_min: a few
    milliseconds instead of an eigendecomposition wasted on TSV-M's ill-conditioned stacks (kappa ~ 1e3)."""
    factor, info = torch.linalg.cholesky_ex(gram, upper=True)
    if info != 0:  # not positive definite in this precision
        return True
    diagonal = factor.diagonal()
    return bool(diagonal.min() * limit < diagonal.max())


def _polar_through_gram(tall: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tall (tall^T tall)^(-1/2), singular values descending) in tall's precision, or None past `limit`."""
    gram = _gram(tall)
    if _surely_past(gram, limit):
        return None
    eigenvalues, eigenvectors = torch.linalg.eigh(gram, UPLO="U")
    if not _well_conditioned(eigenvalues[-1], eigenvalues[0], limit):
        return None
    inverse_root = (eigenvectors * eigenvalues.rsqrt()) @ eigenvectors.T
    return tall @ inverse_root, eigenvalues.flip(0).sqrt()


def polar_and_spectrum(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U V^T, s) of matrix = U diag(s) V^T: the closest matrix with orthonormal columns (rows, if wide) and the
    singular values, descending. Through the Gram: A (A^T A)^(-1/2), in float32 up to FLOAT32_CONDITION_LIMIT,
    in float64 up to CONDITION_LIMIT, beyond that thin_svd's."""
    routes = ((torch.float32, FLOAT32_CONDITION_LIMIT),) if matrix.dtype == torch.float32 else ()
    for dtype, limit in (*routes, (torch.float64, CONDITION_LIMIT)):
        tall, wide = _as_tall(matrix, dtype)
        result = _polar_through_gram(tall, limit)
        if result is not None:
            polar, s = result[0].to(matrix.dtype), result[1].to(matrix.dtype)
            return (polar.T if wide else polar), s
    u, s, vh = thin_svd(matrix)
    return u @ vh, s


def polar(matrix: torch.Tensor) -> torch.Tensor:
    return polar_and_spectrum(matrix)[0]
