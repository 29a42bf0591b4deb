"""Each fine-tune's sampling settings against its task's size, before any job: the expected batch size B may not
exceed the task's N (q = B/N is a probability, and a larger B is a typo that would fail only inside a job), and an
explicit delta may not exceed 1/N (a larger delta admits mechanisms that publish one whole example).

N is known before any job for the embedded tasks (the registry's `train_size`) and for own CSV or JSON-lines tables
and image folders (data/own.py check_data counts them: exactly where the test split is its own file or folder, as
an upper bound where a fraction is held out, so only the batch size is checked there). The paper's datasets, own
Parquet tables and saved datasets are counted when read: the fine-tune refuses the same settings there, before it
trains (training/finetune.py sampling_plan).
"""

from __future__ import annotations

from dpmerge.config_fields import ConfigError, finetune_settings
from dpmerge.data.own import TrainingSize
from dpmerge.data.registry import TASKS
from dpmerge.methods import METHODS

__all__ = ["training_size", "check_sampling"]


def training_size(config: dict, task: str, own_sizes: dict[str, TrainingSize | None]) -> TrainingSize | None:
    """Task `task`'s N as the study trains on it (after data.max_train and data.validation_fraction), or None where
    it is only known once the data are read."""
    if task in own_sizes:
        full = own_sizes[task]
    else:
        size = TASKS[task].train_size if task in TASKS else None
        full = None if size is None else TrainingSize(size, exact=True)
    if full is None:
        return None
    kept = min(full.upper, config["data"]["max_train"]) if config["data"].get("max_train") else full.upper
    fraction = config["data"].get("validation_fraction")
    if fraction:  # loading.load_task holds out max(1, round(fraction * kept)) of the kept examples
        kept -= max(1, round(fraction * kept))
    return TrainingSize(kept, full.exact)


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


def check_sampling(config: dict, own_sizes: dict[str, TrainingSize | None]) -> None:
    """Refuse, naming the field and the largest value that fits, a batch size above a task's N or an explicit
    delta above 1/N, for every method's settings on every task a backbone trains (and the noise study's batch
    sizes)."""
    public_n = config["privacy"].get("public_n") if config["privacy"].get("neighbouring") == "add_remove" else None
    noise = config.get("noise_scale") or {}
    noise_backbones = (noise.get("backbones") or list(config["backbones"])) if noise.get("methods") else []
    for backbone, entry in config["backbones"].items():
        for task in entry["tasks"]:
            size = training_size(config, task, own_sizes)
            if size is None:
                continue
            examples = f"{size.upper} training examples" if size.exact else \
                f"training examples (at most {size.upper})"
            for method in METHODS:
                settings = finetune_settings(config, backbone, method, task)
                batch = settings["batch_size"]
                if batch > size.upper:
                    field = _field_of(config, backbone, method, task, "batch_size")
                    raise ConfigError(
                        f"{field}: {batch:g} exceeds task {task!r}'s {examples}{_sizes_note(config)} ({method} on "
                        f"{backbone}); give at most "
                        f"{size.upper}, or that task its own batch size: backbones.{backbone}.finetune.by_task."
                        f"{task}.batch_size")
                delta = settings.get("delta")
                if delta is None or not METHODS[method].private or not size.exact:
                    continue
                population = public_n.get(task) if isinstance(public_n, dict) else public_n
                population, name = (population, "public_n") if population else (size.upper, "N")
                if delta > (1.0 / population) * (1 + 1e-9):
                    field = _field_of(config, backbone, method, task, "delta")
                    raise ConfigError(
                        f"{field}: {delta:g} exceeds 1/{name} = {1.0 / population:.6g} for task {task!r} "
                        f"({name} = {population}; {method} on {backbone}); a larger delta admits a mechanism that "
                        f"publishes one whole example. Give at most {1.0 / population:.6g}, or leave delta unset "
                        "(1/N, the paper's)")
            if backbone in noise_backbones:
                too_large = [b for b in noise["batch_sizes"] if b > size.upper]
                if too_large:
                    raise ConfigError(
                        f"noise_scale.batch_sizes: {too_large[0]:g} exceeds task {task!r}'s {examples} on "
                        f"{backbone}{_sizes_note(config)}; give values of at most "
                        f"{size.upper}")
