"""dpmerge: differentially private fine-tuning, task vectors and data-free merging.

Implements DP-Merging from "When Privacy Hurts Mergeability" (shared/reference/paper-dp-merging.md):
DP-SAM (two clipped noisy gradients on one Poisson batch) plus an anchor 2*lambda*(w - w0) toward the
pretrained weights, followed by any data-free merge operator.
"""

import torch


def _define_torchvision_op_schemas() -> None:
    """Declare torchvision's C++ op schemas when its compiled ops cannot load.

    The pinned torchvision wheel is a CUDA build; beside the CPU torch wheel its C ops fail to load, and
    `import torchvision` (pulled in by timm, open_clip and transformers' model classes) dies with
    "operator torchvision::nms does not exist" while registering fake kernels for those ops. We never call
    nms; declaring the schemas lets the import finish. Skipped when a working build already defines them.
    """
    try:
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
        return
    except RuntimeError:
        pass
    lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - kept alive below
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _define_torchvision_op_schemas.library = lib


_define_torchvision_op_schemas()

__version__ = "0.1.0"
