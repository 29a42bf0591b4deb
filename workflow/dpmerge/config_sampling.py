"""Each fine-tune's sampling settings against its task's size, before any job: the expected batch size B may not
exceed the task's N (q = B/N is a probability, and a larger B is a typo that would fail only inside a job), and an
explicit delta may not exceed 1/N (a larger delta admits mechanisms that publish one whole example).

N is known before any job for the embedded tasks (the registry's `train_size`) and for own tasks (the config check
reads them whole, as `prepare` will: data/own_readers.py training_examples). The paper's datasets are counted when
read: `prepare`, which reads every task before its fine-tunes, is given each task's largest batch size and delta
(`sampling_limits`) and refuses them there, naming the field; the fine-tune checks again before it trains
(training/finetune.py sampling_plan).
"""

from __future__ import annotations

from dpmerge.config_fields import ConfigError, finetune_settings
from dpmerge.data.registry import TASKS
from dpmerge.methods import METHODS

__all__ = ["training_size", "check_sampling", "sampling_limits", "check_limits"]


def training_size(config: dict, task: str, own_sizes: dict[str, int | None]) -> int | None:
    """Task `task`'s N as the study trains on it (after data.max_train and data.validation_fraction), or None where
    it is only known once the data are read."""
    full = own_sizes[task] if task in own_sizes else (TASKS[task].train_size if task in TASKS else None)
    if full is None:
        return None
    kept = min(full, config["data"]["max_train"]) if config["data"].get("max_train") else full
    fraction = config["data"].get("validation_fraction")
    if fraction:  # loading.load_task holds out max(1, round(fraction * kept)) of the kept examples
        kept -= max(1, round(fraction * kept))
    return kept


def _field_of(config: dict, backbone: str, method: str, task: str, key: str) -> str:
    """The dotted config field that sets `key` for this fine-tune: the most specific level that names it."""
    own = config["backbones"][backbone].get("finetune", {})
    levels = [
        (f"backbones.{backbone}.finetune.by_task.{task}", (own.get("by_task") or {}).get(task, {})),
        (f"backbones.{backbone}.finetune.by_method.{method}", (own.get("by_method") or {}).get(method, {})),
        (f"backbones.{backbone}.finetune", own),
        (f"finetune.by_method.{method}", (config["finetune"].get("by_method") or {}).get(method, {})),
    ]
    return next((f"{where}.{key}" for where, level in levels if key in level), f"finetune.{key}")


def _sizes_note(config: dict) -> str:
    caps = ["data.max_train" if config["data"].get("max_train") else "",
            "data.validation_fraction" if config["data"].get("validation_fraction") else ""]
    return f" (after {' and '.join(c for c in caps if c)})" if any(caps) else ""


def check_sampling(config: dict, own_sizes: dict[str, int | None]) -> None:
    """Refuse, naming the field and the largest value that fits, a batch size above a task's N or an explicit
    delta above 1/N (1/public_n under add/remove with a public size, known whatever N is), for every method's
    settings on every task a backbone trains (and the noise study's batch sizes): `prepare`'s check
    (`check_limits`), made here wherever N is known before any job."""
    for backbone, entry in config["backbones"].items():
        for task in entry["tasks"]:
            limits = sampling_limits(config, backbone, task)
            public_n = _public_n(config, task)
            if public_n and limits["delta"] is not None:
                _check_delta(*limits["delta"], task, public_n, "public_n", "")
            size = training_size(config, task, own_sizes)
            if size is not None:
                check_limits(limits, size, _sizes_note(config))


def _public_n(config: dict, task: str):
    public_n = config["privacy"].get("public_n") if config["privacy"].get("neighbouring") == "add_remove" else None
    return public_n.get(task) if isinstance(public_n, dict) else public_n


def sampling_limits(config: dict, backbone: str, task: str) -> dict:
    """What `prepare` holds against a task's N once it has read the data: the largest expected batch size any
    fine-tune of the task uses and the largest explicit delta of a private one (with the config fields that set
    them), and whether delta is bounded by 1/N (not under add/remove with a public size). Empty for a dataset the
    backbone only reads (its public data): nothing is fine-tuned on it."""
    if task not in config["backbones"][backbone]["tasks"]:
        return {}
    noise = config.get("noise_scale") or {}
    noise_backbones = (noise.get("backbones") or list(config["backbones"])) if noise.get("methods") else []
    batches = [(finetune_settings(config, backbone, method, task)["batch_size"],
                _field_of(config, backbone, method, task, "batch_size")) for method in METHODS]
    if backbone in noise_backbones:
        batches += [(b, "noise_scale.batch_sizes") for b in noise["batch_sizes"]]
    deltas = [(settings["delta"], _field_of(config, backbone, method, task, "delta")) for method in METHODS
              if METHODS[method].private
              and (settings := finetune_settings(config, backbone, method, task)).get("delta") is not None]
    return {"backbone": backbone, "task": task, "batch_size": max(batches, key=lambda b: b[0]),
            "delta": max(deltas, key=lambda d: d[0]) if deltas else None,
            "delta_bounded_by_n": _public_n(config, task) is None}


def check_limits(limits: dict, num_examples: int, counted: str = " (as read by prepare)") -> None:
    """`sampling_limits` against a task's N, `counted` saying how it was known: one line naming the field and the
    fix."""
    if not limits:
        return
    task, backbone = limits["task"], limits["backbone"]
    batch, field = limits["batch_size"]
    if batch > num_examples:
        fix = (f"give values of at most {num_examples}" if field.startswith("noise_scale.") else
               f"give at most {num_examples}, or that task its own batch size: "
               f"backbones.{backbone}.finetune.by_task.{task}.batch_size")
        raise ConfigError(f"{field}: {batch:g} exceeds task {task!r}'s {num_examples} training examples{counted}; "
                          f"{fix}")
    if limits["delta"] is not None and limits["delta_bounded_by_n"]:
        _check_delta(*limits["delta"], task, num_examples, "N", counted)


def _check_delta(delta: float, field: str, task: str, population: int, name: str, counted: str) -> None:
    if delta > (1.0 / population) * (1 + 1e-9):
        how = counted.strip(" ()")
        raise ConfigError(
            f"{field}: {delta:g} exceeds 1/{name} = {1.0 / population:.6g} for task {task!r} ({name} = {population}"
            f"{', ' + how if how else ''}); a larger delta admits a mechanism that publishes one whole example. Give "
            f"at most {1.0 / population:.6g}, or leave delta unset (1/N, the paper's)")
