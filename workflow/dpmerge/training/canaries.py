"""Canaries for one-run privacy audits (privacy/audit.py): white-box Dirac gradients in the DP step, and
black-box mislabeled examples in the training set.

Canary j is an extra "example" whose per-example gradient is C e_j, C the clipping norm and e_j one coordinate
of the released task vector (Steinke, Nasr & Jagielski, arXiv 2305.08846, Sec. 6: Dirac canaries). Its norm is
exactly C, so clipping leaves it as it is, and it joins the clipped sum, the Gaussian mechanism's input, like
any example (the DP step adds every term onto the noise it drew first; the order of the additions changes nothing).
What makes the audit an audit of the accounted mechanism:
- each canary is in the audited dataset with probability 1/2 (a secret coin), and an included canary joins a
  step's batch with the examples' sampling rate q (Poisson), drawn once per step, so DP-SAM's two queries see
  the same batch, canaries included;
- every draw (coordinates, coins, the canaries' sampling) comes from the study key under the audit run's own
  identity, independent of every release's randomness.
The score of canary j is -tau_j, read from the released vector: descent moves the weight against C e_j.

Black-box canaries (`InputCanaries`) are examples: held-out test examples, each given a label drawn uniformly
among its wrong classes, each in the training set with probability 1/2; the trained model's loss on a canary's
wrong label is low when it was trained on, so its score is minus that loss. They go through the pipeline as
the data does (sampling, clipping, noise), which is what a black-box audit measures, and they see only what a
model user sees.
"""

from __future__ import annotations

import torch


class WhiteBoxAudit:
    """The hook a white-box audit hands to finetune(audit=...): the training set as it is, and `count` Dirac
    canaries added to every query's clipped sum."""

    def __init__(self, count: int):
        self.count = count

    def training_set(self, features: tuple[torch.Tensor, ...], labels: torch.Tensor):
        return features, labels

    def gradient_canaries(self, **placement) -> DiracCanaries:
        return DiracCanaries(count=self.count, **placement)


class DiracCanaries:
    def __init__(self, *, released_shapes: dict[str, torch.Size], count: int, clip_norm: float, sample_rate: float,
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
        return dirac_scores([name for name, _ in self.released_layout], self.coordinates, task_vector)

    def steps_in_batch(self) -> int:
        return int(self._active.sum())


def dirac_scores(names: list[str], coordinates: torch.Tensor, task_vector: dict[str, torch.Tensor]) -> torch.Tensor:
    """-tau at each canary's coordinate, the coordinates flat over `names` in that order."""
    flat = torch.cat([task_vector[name].reshape(-1).double() for name in names])
    return -flat[coordinates]


class InputCanaries:
    def __init__(self, features: tuple[torch.Tensor, ...], labels: torch.Tensor, num_classes: int, randomness):
        """`features`, `labels`: m held-out examples (never in the training set) with their true labels."""
        count = int(labels.shape[0])
        if count < 2 or num_classes < 2:
            raise ValueError(f"black-box canaries need at least 2 held-out examples and 2 classes, got {count} "
                             f"and {num_classes}")
        if labels.is_floating_point():
            raise ValueError("black-box canaries are mislabeled examples: the task must be a classification")
        self.features = tuple(f.clone() for f in features)
        self.true_labels = labels.long().clone()  # which group a canary comes from (stages/audit.py)
        shift = 1 + (randomness.stream("audit_input_canary_labels").uniform(count) * (num_classes - 1)).long()
        self.labels = (labels.long() + shift.clamp(max=num_classes - 1)) % num_classes  # never the true label
        self.included = randomness.stream("audit_input_canary_membership").uniform(count) < 0.5

    def training_set(self, features: tuple[torch.Tensor, ...], labels: torch.Tensor):
        """The training set with the included canaries appended (N grows by their number, as it would)."""
        pick = torch.nonzero(self.included).flatten()
        return (tuple(torch.cat([f, c[pick].to(f.dtype)]) for f, c in zip(features, self.features)),
                torch.cat([labels, self.labels[pick].to(labels.dtype)]))

    def gradient_canaries(self, **placement) -> None:
        """A black-box audit adds nothing to the gradients: its canaries are in the training set."""
        return None

    def scores(self, per_example_loss) -> torch.Tensor:
        """Minus each canary's loss on its wrong label under the released model (`per_example_loss(features,
        labels)` -> one loss per example)."""
        return -per_example_loss(self.features, self.labels).double()
