"""A task vector from two checkpoints as people have them (`dpmerge task-vector`): tau = w_finetuned -
w_pretrained over the floating-point tensors both hold at one shape, streamed one tensor at a time, with what
was left out listed and recorded. It carries no privacy record (whoever fine-tuned knows how); `dpmerge merge`
merges it with a warning and checks its base against the `w0_sha256` it records.
"""

from __future__ import annotations

import torch

from dpmerge.artifacts import all_finite, check_output_path, tensors_sha256_of, write_tensors_streaming
from dpmerge.checkpoints import open_checkpoint
from dpmerge.runtime import compute_section
from dpmerge.stages.common import log, recorded_paths, warn

# Why a tensor stays out of the vector, as the warning says it
LEFT_OUT = {
    "only_finetuned": "only in the fine-tuned checkpoint, e.g. a task head: keep it with that model",
    "only_pretrained": "only in the pretrained checkpoint",
    "shape_differs": "a different shape in each, e.g. heads of other classes",
    "not_floating_point": "integer or boolean buffers",
}


def task_vector(*, pretrained: str, finetuned: str, out: str, dtype: str = "pretrained") -> None:
    """Write tau = finetuned - pretrained to `out`, stored at the pretrained tensor's precision (`dtype`
    "pretrained") or in float32, computed in at least float32 either way."""
    check_output_path(out)
    base, tuned = open_checkpoint(pretrained), open_checkpoint(finetuned)
    names = matched_names(base.keys(), tuned.keys())  # pretrained name -> fine-tuned name
    if not names:
        raise ValueError(f"{pretrained} and {finetuned} share no tensor names (pretrained has e.g. "
                         f"{base.keys()[:3]}, fine-tuned {tuned.keys()[:3]}): not two checkpoints of one model")
    left_out = {
        "only_finetuned": sorted(set(tuned.keys()) - set(names.values())),
        "only_pretrained": sorted(set(base.keys()) - set(names)),
        "shape_differs": [key for key, other in names.items() if base.shape(key) != tuned.shape(other)],
        "not_floating_point": [key for key, other in names.items()
                               if not (base.dtype(key).is_floating_point and tuned.dtype(other).is_floating_point)],
    }
    skipped = set(left_out["shape_differs"]) | set(left_out["not_floating_point"])
    keys = [key for key in sorted(names) if key not in skipped]
    if not keys:
        raise ValueError(f"{pretrained} and {finetuned} share no floating-point tensor of one shape")

    def stored_dtype(key: str) -> torch.dtype:
        return torch.float32 if dtype == "float32" and base.dtype(key) != torch.float64 else base.dtype(key)

    def differences():
        for key in keys:
            before, after = base.get_tensor(key), tuned.get_tensor(names[key])
            wide = torch.promote_types(torch.promote_types(before.dtype, after.dtype), torch.float32)
            difference = after.to(wide) - before.to(wide)
            if not all_finite(difference):
                raise ValueError(f"tensor {key!r}: the difference of {finetuned} and {pretrained} holds NaN or Inf")
            yield key, difference.to(stored_dtype(key))

    pretrained_name, finetuned_name = recorded_paths([pretrained, finetuned], out)
    record = {
        "artifact": "task_vector",
        "pretrained": pretrained_name,
        "finetuned": finetuned_name,
        # the weights this vector is a difference from, as 'dpmerge merge' checks its base against them
        "w0_sha256": tensors_sha256_of(base, keys, finite=True),
        "finetuned_sha256": tensors_sha256_of(tuned, [names[key] for key in keys], finite=True),
        "renamed": {key: names[key] for key in keys if names[key] != key},
        "left_out": left_out,
    }
    layout = {key: (stored_dtype(key), base.shape(key)) for key in keys}
    with compute_section("task vector (read, subtract and write, streamed)", log):
        write_tensors_streaming(out, layout, differences(), record)
    count = sum(torch.Size(base.shape(key)).numel() for key in keys)
    log(f"[task-vector] {len(keys)} tensors ({count:,} parameters) -> {out}")
    for reason, listed in left_out.items():
        if listed:
            warn(f"{len(listed)} tensor(s) not in the task vector ({LEFT_OUT[reason]}): {', '.join(listed[:4])}"
                 f"{', ...' if len(listed) > 4 else ''}; recorded under left_out")


def matched_names(pretrained: list[str], finetuned: list[str]) -> dict[str, str]:
    """Each pretrained tensor name -> the fine-tuned name of the same tensor. Usually the same name; a model
    fine-tuned with a task head often nests the pretrained one under a prefix (transformers' base_model_prefix:
    `bert.encoder...` against `encoder...`), and the prefix that matches the most names is stripped (or added)."""
    held = set(finetuned)
    best = {key: key for key in pretrained if key in held}
    candidates = {key.split(".", 1)[0] + "." for key in [*finetuned, *pretrained] if "." in key}
    for prefix in sorted(candidates):
        added = {key: prefix + key for key in pretrained if prefix + key in held}
        stripped = {key: key.removeprefix(prefix) for key in pretrained
                    if key.startswith(prefix) and key.removeprefix(prefix) in held}
        for found in (added, stripped):
            if len(found) > len(best):
                best = found
    return best
