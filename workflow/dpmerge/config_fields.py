"""What the config checks share: the error they raise, how a merge entry names its operator and hyperparameters,
where a method is released and with which settings, and the check of a merge that must be data-free. Imported by
config_check.py (the whole config) and config_studies.py (the studies' sections), so neither imports the other's
internals.
"""

from __future__ import annotations

from dpmerge.epsilon import eps_label
from dpmerge.merge.specs import SPECS as OPERATORS

MERGE_META_KEYS = ("operator", "vectors", "statistics", "denoise")


class ConfigError(ValueError):
    def __init__(self, message: str):
        super().__init__(f"config error: {message}")


def merge_operator(config: dict, name: str) -> str:
    return config["merge"][name].get("operator", name)


def merge_hyperparameters(config: dict, name: str) -> dict:
    return {k: v for k, v in config["merge"][name].items() if k not in MERGE_META_KEYS}


def denoised_counterpart(config: dict, name: str) -> str | None:
    """The merge entry a denoised entry is compared with: the first entry with its operator, hyperparameters,
    vectors and statistics and no `denoise`; None where there is none (or `name` is not denoised)."""
    entry = config["merge"][name]
    if "denoise" not in entry:
        return None
    plain = {k: v for k, v in entry.items() if k != "denoise"}
    for other, settings in config["merge"].items():
        if "denoise" in settings or other == name:
            continue
        if merge_operator(config, other) == merge_operator(config, name) and (
                {k: v for k, v in settings.items() if k != "operator"}
                == {k: v for k, v in plain.items() if k != "operator"}):
            return other
    return None


def released_budgets(config: dict, backbone: str, method: str) -> list[float]:
    """The budgets `method` is released at on `backbone`: the main grid's and the epsilon sweep's."""
    budgets = list(config["epsilons"]) if method in config["methods"] else []
    sweep = (config.get("sweeps") or {}).get("epsilon")
    if sweep and method in sweep["methods"] and backbone in (sweep.get("backbones") or config["backbones"]):
        budgets += sweep["epsilons"]
    return sorted({eps_label(e): float(e) for e in budgets}.values())


def finetune_settings(config: dict, backbone: str, method: str, task: str | None = None) -> dict:
    """A method's fine-tuning settings on a backbone: global < global by_method[method] < the backbone's finetune <
    the backbone's by_method[method] < (given a task) the backbone's by_task[task], which sets a batch size only
    (the schema has filled in the defaults)."""
    merged = {}
    backbone_level = config["backbones"][backbone].get("finetune", {})
    for level in (config["finetune"], backbone_level):
        level = dict(level)
        by_method = level.pop("by_method", {})
        level.pop("by_task", None)
        merged.update(level)
        merged.update(by_method.get(method, {}))
    if task is not None:
        merged.update((backbone_level.get("by_task") or {}).get(task, {}))
    return merged


def check_data_free_merge(config: dict, name: str, field: str, why: str) -> None:
    """`name` is a configured merge that reads no data statistics, gives one model and merges task vectors."""
    if name not in config["merge"]:
        raise ConfigError(f"{field}: {name!r} is not among the configured merges ({', '.join(config['merge'])})")
    if "denoise" in config["merge"][name]:
        raise ConfigError(f"{field}: {name!r} merges denoised releases, which only the main grid's merges make; "
                          f"{why}: name its entry without denoise")
    operator = OPERATORS[merge_operator(config, name)]
    if operator.personalized or operator.statistic or config["merge"][name].get("vectors", "task") != "task":
        raise ConfigError(f"{field}: {name!r} needs data statistics, gives one model per task or merges "
                          f"difference vectors; {why}")
