"""How the matrix-shaped merge rules see a parameter tensor: as the weight matrix of a linear map, or not at all.

WUDI-merging (Cheng et al., "Whoever Started the Interference Should End It: Guiding Data-Free Model Merging
via Task Vectors", arXiv 2503.08099), TSV-M (Gargiulo et al., "Task Singular Vectors: Reducing Task
Interference in Model Merging", arXiv 2412.00081), Iso-C and Iso-CTS (Marczak et al., "No Task Left Behind:
Isotropic Model Merging with Common and Task-Specific Subspaces", arXiv 2502.04959) and DTS (Guo et al., "Stay
Unique, Stay Efficient: Preserving Model Personality in Multi-Task Merging", arXiv 2512.01461) act on each linear
layer's weight matrix; RegMean averages what is not a linear layer's weight, as these do. Their reference code
treats exactly the 2-D tensors so; with include_conv, a convolution weight (out, in, kh, kw) is treated as the
linear map (out, in*kh*kw) it applies to unfolded patches, which is what it is. Every other tensor (biases,
norms, 1-D parameters) is averaged, as in the reference code.
"""

from __future__ import annotations

import torch


def matrix_view(tensor: torch.Tensor, include_conv: bool) -> torch.Tensor | None:
    """The tensor as a (out, in) matrix, or None where it is not a linear map's weight."""
    if tensor.ndim == 2:
        return tensor
    if include_conv and tensor.ndim == 4:
        return tensor.reshape(tensor.shape[0], -1)
    return None


def mean_of(tensors):
    """What a matrix-shaped rule does with a tensor that is not a matrix: the plain average, without the stack's
    T-fold copy (a ViT's 2.4M-parameter patch embedding is one)."""
    return sum_of(tensors).div_(len(tensors))


def sum_of(tensors):
    """The tensors' sum, added one at a time into a copy of the first, without the stack's T-fold copy (450 MB for 8
    vectors of two ViT-B blocks). Equal to torch.stack(tensors).sum(0) up to float rounding only: for more than
    four tensors torch's reduction groups them differently."""
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total.add_(tensor)
    return total
