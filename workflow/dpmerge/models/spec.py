"""A backbone from its config entry (the JSON `--backbone-spec` every rule passes): the entry's fields checked
against the registry's options, then the backbone built and placed where the config's `compute:` says.

The registry (models/registry.py) stays torch-free for the Snakefile; building happens here, on demand.
"""

from __future__ import annotations

from dpmerge.models.registry import BACKBONES, load_backbone

# Where and how a backbone runs (config `compute:`), carried in the backbone spec so every rule sees the same.
RUN_SETTINGS = ("device", "precision")


def weights_spec(spec: dict) -> dict:
    """The part of a backbone spec that decides its weights: the spec without its run settings, so a model saved
    on one device or precision is recognised on another."""
    return {key: value for key, value in spec.items() if key not in RUN_SETTINGS}


def backbone_from_spec(spec: dict):
    """Build a backbone from a config entry: {kind, trainable_blocks, [max_length], [image_size], [checkpoint],
    [device], [precision], ...} (BACKBONES[kind].options lists each kind's fields)."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone kind {kind!r}; known: {', '.join(sorted(BACKBONES))}")
    run = {key: spec.pop(key) for key in RUN_SETTINGS if key in spec}
    spec.pop("image_size", None)  # used by the task loader, not by the network
    unknown = set(spec) - set(BACKBONES[kind].options)
    if unknown:
        raise ValueError(
            f"backbone kind {kind!r} takes no option(s) {sorted(unknown)}; "
            f"options: {', '.join(BACKBONES[kind].options)}"
        )
    try:
        # CPU unless the spec says otherwise: the workflow leaves the defaults out of the spec
        backbone = load_backbone(kind, **spec).set_device(**{"device": "cpu", "precision": "fp32", **run})
    except ValueError as error:
        raise ValueError(f"backbone {kind!r}: {error}") from None
    log_loaded(backbone)
    return backbone


def log_loaded(backbone) -> None:
    """Say in the job's log which weights were loaded (the file's hash is in every release's record as
    pretrained_sha256; hashing a multi-GB checkpoint in every job only to log it would cost seconds)."""
    path = getattr(backbone, "checkpoint_path", None)
    size = f", {path.stat().st_size / 2**20:.1f} MiB" if path is not None and path.is_file() else ""
    print(f"[backbone] {backbone.kind}: pretrained weights from {path}{size}; device {backbone.device}, "
          f"precision {backbone.precision}", flush=True)
