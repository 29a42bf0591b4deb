"""What a personalized merge (EMR, TALL masks, DTS: one model per task) costs to store beside the shared model,
as recorded in the merged model's metadata (`personalized`) and logged by `dpmerge merge`.

The per-tensor part sizes come from the resolved merge (`ResolvedMerge.part_bits`, next to `stored_layout`);
this module adds them up over a model.
"""

from __future__ import annotations

import torch


def personalized_storage(merge, layout: dict) -> dict:
    """Bits one task's parts add to the shared model, the shared model's own bits, and their ratio, for a
    personalized `merge` (merge.registry.ResolvedMerge).

    `layout` maps each merged tensor's name to (dtype, shape), as w0 stores it.
    """
    extra = sum(merge.part_bits(shape, dtype) for dtype, shape in layout.values())
    model = sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() * 8
                for dtype, shape in layout.values())
    return {"extra_bits_per_task": extra, "model_bits": model, "extra_storage_per_task": extra / model}
