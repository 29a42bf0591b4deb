"""A fine-tune's resumable state: what identifies the run it belongs to, saving it, and resuming from it.

A checkpoint is private (it holds the secret generators' states): never a release, kept under the results
folder's checkpoints/. A resumed run is bit-identical to an uninterrupted one (same batches, same noise), so the
released vector and its record are the same and no budget is spent twice.
"""

from __future__ import annotations

import collections
from dataclasses import asdict
from pathlib import Path

import torch

from dpmerge.artifacts import atomic_write, tensors_sha256
from dpmerge.privacy.study_key import mechanism_fingerprint


def run_fingerprint(config, study_key: bytes, mechanism: dict, streams, *, num_examples: int, data_sha256: str,
                    pretrained_sha256: str, parameters: list[str], sigma: float, strategy: str, precision: str,
                    train_head: bool, head: dict | None) -> dict:
    """Everything a saved state must share with this run to resume it."""
    return {
        "config": asdict(config),
        # the same study key and mechanism identity, or the resumed streams would not be this run's
        "randomness": mechanism_fingerprint(study_key, mechanism),
        # how the streams cut their draws over generators: a checkpoint from another layout cannot resume them
        "random_streams": [stream.layout for stream in streams],
        "num_examples": num_examples,
        "data_sha256": data_sha256,
        "pretrained_sha256": pretrained_sha256,
        "parameters": parameters,
        "sigma": sigma,
        # strategies agree only up to float rounding; a resume must reproduce the run bit for bit
        "per_sample_gradients": strategy,
        "precision": precision,
        "train_head": train_head,
        "head_sha256": tensors_sha256(head) if head is not None else None,
    }


def save_checkpoint(path: Path, fingerprint: dict, step: int, steps_by_queries: dict, params, optimizer, sampler,
                    noise, memory: dict) -> None:
    state = {
        "fingerprint": fingerprint,
        "step": step,
        "steps_by_queries": dict(steps_by_queries),
        "params": [p.detach().cpu() for p in params],
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.get_state(),
        "noise": noise.get_state(),
        # the step functions' state across steps (DPSAT's previous privatized gradient)
        "memory": {key: [t.detach().cpu() for t in value] for key, value in memory.items()},
    }
    atomic_write(path, lambda tmp: torch.save(state, tmp), private=True)


def load_checkpoint(path: Path, fingerprint: dict, log) -> dict | None:
    """The saved state, or None (start clean) when there is none or it belongs to another run."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        saved = state["fingerprint"]
    except Exception as error:  # a truncated or foreign file: never trust it, never crash on it
        log(f"[finetune] checkpoint {path} is unreadable ({type(error).__name__}: {error}); starting clean")
        return None
    if saved != fingerprint:
        differing = sorted(k for k in fingerprint if saved.get(k) != fingerprint[k])
        log(f"[finetune] checkpoint {path} belongs to another run (differs in {differing}); starting clean")
        return None
    return state


def resume(path: Path, fingerprint: dict, params, optimizer, sampler, noise, memory: dict,
           steps_by_queries: collections.Counter, device, log) -> int:
    """Restore a saved state of this run into the live objects; the step to start from (0 without one)."""
    state = load_checkpoint(path, fingerprint, log)
    if state is None:
        return 0
    with torch.no_grad():
        for p, value in zip(params, state["params"]):
            p.copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    sampler.set_state(state["sampler"])
    noise.set_state(state["noise"])
    steps_by_queries.update(state["steps_by_queries"])
    memory.update({key: [t.to(device) for t in value] for key, value in state.get("memory", {}).items()})
    return state["step"]
