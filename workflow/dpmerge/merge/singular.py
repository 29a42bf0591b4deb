"""Singular triplets and polar factors for the spectral merges, from the float64 Gram matrix where that is exact.

TSV-M keeps each task's top 1/T singular triplets and orthogonalises them; Iso-C and Iso-CTS need a polar factor
and a spectrum. A full float32 SVD (torch's divide and conquer) of a 3072 x 768 matrix costs about twice the
float64 Gram product and its symmetric eigendecomposition on CPU, and the Gram route in float64 is the more exact
of the two where the matrix is well conditioned: against a float64 SVD, the merges through it are within ~1e-5
of the largest merged entry, a float32 SVD's within 3e-5 to 1e-4 (tests/test_singular.py, bench/spectral_compute.py).
The Gram squares the condition number, so where the singular values used span more than CONDITION_LIMIT (or a
matrix is zero) these fall back to the SVD itself, and a merge of such matrices is today's to the last bit.
"""

from __future__ import annotations

import torch

# sigma_max / sigma_min above which the Gram route's float64 error (~1e-16 x condition^2) could reach 1e-8.
CONDITION_LIMIT = 1e4


def thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.linalg.svd(matrix, full_matrices=False), from the transpose where the matrix is wider than tall.
    On CPU, torch's divide-and-conquer SVD of a wide matrix (ViT's fc2, 768 x 3072) is slower than of its
    transpose; the factors are the same up to the sign of each singular pair, which none of TSV-M, Iso-C or
    Iso-CTS depends on (DTS quantizes the factors themselves, so it keeps torch's own signs)."""
    if matrix.shape[0] >= matrix.shape[1]:
        return torch.linalg.svd(matrix, full_matrices=False)
    v, s, uh = torch.linalg.svd(matrix.T, full_matrices=False)
    return uh.T, s, v.T


def _gram_eigh(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(the matrix as tall, in float64; its Gram's eigenvalues, ascending; their eigenvectors; was it wide)."""
    wide = matrix.shape[0] < matrix.shape[1]
    tall = (matrix.T if wide else matrix).double()
    eigenvalues, eigenvectors = torch.linalg.eigh(tall.T @ tall)
    return tall, eigenvalues, eigenvectors, wide


def _well_conditioned(largest: torch.Tensor, smallest: torch.Tensor) -> bool:
    return bool(largest > 0) and bool(smallest * CONDITION_LIMIT**2 >= largest)


def top_singular(matrix: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k largest singular triplets of a float32 matrix: u (out x k), s (k), vh (k x in), as thin_svd's first k.

    Through the float64 eigendecomposition of the smaller Gram, u = A v / s; where sigma_k < sigma_1 /
    CONDITION_LIMIT that would lose digits, so it is thin_svd's."""
    if k == 0:
        return matrix.new_zeros(matrix.shape[0], 0), matrix.new_zeros(0), matrix.new_zeros(0, matrix.shape[1])
    tall, eigenvalues, eigenvectors, wide = _gram_eigh(matrix)
    if not _well_conditioned(eigenvalues[-1], eigenvalues[-k]):
        u, s, vh = thin_svd(matrix)
        return u[:, :k], s[:k], vh[:k]
    s = eigenvalues[-k:].flip(0).sqrt()
    v = eigenvectors[:, -k:].flip(1)
    u = (tall @ v) / s
    u, s, v = u.to(matrix.dtype), s.to(matrix.dtype), v.to(matrix.dtype)
    return (v, s, u.T) if wide else (u, s, v.T)


def polar_and_spectrum(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U V^T, s) of matrix = U diag(s) V^T: the closest matrix with orthonormal columns (rows, if wide) and the
    singular values, descending. Through the Gram: A (A^T A)^(-1/2), unless the matrix's condition number
    exceeds CONDITION_LIMIT, where it is thin_svd's."""
    tall, eigenvalues, eigenvectors, wide = _gram_eigh(matrix)
    if not _well_conditioned(eigenvalues[-1], eigenvalues[0]):
        u, s, vh = thin_svd(matrix)
        return u @ vh, s
    inverse_root = (eigenvectors * eigenvalues.rsqrt()) @ eigenvectors.T
    polar = (tall @ inverse_root).to(matrix.dtype)
    s = eigenvalues.flip(0).sqrt().to(matrix.dtype)
    return (polar.T if wide else polar), s


def polar(matrix: torch.Tensor) -> torch.Tensor:
    return polar_and_spectrum(matrix)[0]
