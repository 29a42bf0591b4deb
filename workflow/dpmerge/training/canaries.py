"""White-box canaries for one-run privacy audits (privacy/audit.py): Dirac gradients in the DP step.

Canary j is an extra "example" whose per-example gradient is C e_j, C the clipping norm and e_j one coordinate
of the released task vector (Steinke, Nasr & Jagielski, arXiv 2305.08846, Sec. 6: Dirac canaries). Its norm is
exactly C, so clipping leaves it as it is, and it adds to the clipped sum before the noise like any example.
What makes the audit an audit of the accounted mechanism:
- each canary is in the audited dataset with probability 1/2 (a secret coin), and an included canary joins a
  step's batch with the examples' sampling rate q (Poisson), drawn once per step, so DP-SAM's two queries see
  the same batch, canaries included;
- every draw (coordinates, coins, the canaries' sampling) comes from the study key under the audit run's own
  identity, independent of every release's randomness.
The score of canary j is -tau_j, read from the released vector: descent moves the weight against C e_j.
"""

from __future__ import annotations

import torch


class DiracCanaries:
    def __init__(self, released_shapes: dict[str, torch.Size], count: int, clip_norm: float, sample_rate: float,
                 randomness, to_internal, internal_names: list[str]):
        """`released_shapes`: the task vector's tensors; `to_internal` maps released-name tensors to the
        network's parameter names (Backbone.internal_state); `internal_names`: the trained parameters in the
        order the DP step's gradient lists have them (names absent from the mapping, e.g. the head, get no
        canary)."""
        total = sum(shape.numel() for shape in released_shapes.values())
        if not 0 < count <= total:
            raise ValueError(f"audit.canaries must be in 1..{total} (the task vector's coordinates), got {count}")
        generator = torch.Generator().manual_seed(randomness.seed("audit_canary_coordinates"))
        self.coordinates = torch.randperm(total, generator=generator)[:count]  # distinct, flat over released names
        self.included = randomness.stream("audit_canary_membership").uniform(count) < 0.5
        self._sampler = randomness.stream("audit_canary_sampler")
        self.clip_norm, self.sample_rate = float(clip_norm), float(sample_rate)
        self.released_layout = [(name, shape) for name, shape in released_shapes.items()]
        self._targets = self._internal_targets(to_internal, internal_names)
        self._active = torch.zeros(count, dtype=torch.bool)

    def _internal_targets(self, to_internal, internal_names: list[str]) -> list[tuple[int, int]]:
        """(parameter index, flat index) of each canary in the DP step's gradient list. The released names may
        split or fuse the network's tensors, so each coordinate's place is found by sending ids through the
        mapping; a mapping that is not a rearrangement of coordinates is refused."""
        ids, start = {}, 0
        for name, shape in self.released_layout:
            ids[name] = torch.arange(start, start + shape.numel(), dtype=torch.float64).reshape(shape) + 1
            start += shape.numel()
        internal = to_internal(ids)
        wanted = self.coordinates.double() + 1
        where = {}
        for index, name in enumerate(internal_names):
            if name is None or name not in internal:
                continue
            values = internal[name].reshape(-1)
            if not bool(torch.all((values == values.round()) & (values >= 1))):
                raise ValueError(f"{name}: the backbone's released names are not a rearrangement of its "
                                 "parameters; Dirac canaries cannot be placed")
            for flat in torch.nonzero(torch.isin(values, wanted)).flatten().tolist():
                where[int(values[flat]) - 1] = (index, flat)
        missing = [int(c) for c in self.coordinates if int(c) not in where]
        if missing:
            raise ValueError(f"canary coordinates {missing[:3]} have no trained parameter")
        return [where[int(c)] for c in self.coordinates]

    def begin_step(self) -> None:
        """Which included canaries join this step's batch (Poisson, rate q); every query of the step uses them."""
        self._active = self.included & (self._sampler.uniform(len(self.included)) < self.sample_rate)

    def add_to(self, gradients: list[torch.Tensor], scale: float = 1.0) -> None:
        """Add C e_j (times `scale`) for every canary in this step's batch to the gradient list, in place."""
        for j in torch.nonzero(self._active).flatten().tolist():
            index, flat = self._targets[j]
            gradients[index].view(-1)[flat] += self.clip_norm * scale

    def scores(self, task_vector: dict[str, torch.Tensor]) -> torch.Tensor:
        """-tau_j for every canary, read from a released (or merged) task vector's tensors."""
        flat = torch.cat([task_vector[name].reshape(-1).double() for name, _ in self.released_layout])
        return -flat[self.coordinates]

    def steps_in_batch(self) -> int:
        return int(self._active.sum())
