"""dpmerge: differentially private fine-tuning, task vectors and data-free merging.

Implements DP-Merging from "When Privacy Hurts Mergeability" (arXiv 2608.26655): DP-SAM (two clipped noisy
gradients on one Poisson batch) plus an anchor 2*lambda*(w - w0) toward the pretrained weights, followed by
any data-free merge operator. Where things live: docs/architecture.md's table of rooms; importing the package has no
side effects (process tuning is dpmerge.runtime, called where a command starts).
"""

__version__ = "0.1.0"
