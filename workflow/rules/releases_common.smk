# A release is forever (dpmerge/privacy/release_log.py). Before any job, and so before Snakemake deletes an earlier
# release's files to make it again, a release whose settings differ from those its path was released with is
# refused, unless the study allows replacing releases (each stage checks the full identity too): a fine-tune, a
# private merge statistic, an audit run. A refused job would leave its file deleted and, its downstream outputs
# being up to date, Snakemake would not make it again once allowed.


def fine_tune_settings(group, task):
    """run_settings of one fine-tune (or the audit run of it), as the rules pass them to the stage."""
    wildcards = SimpleNamespace(task=task, **{k: group[k] for k in ("backbone", "eps", "method", "seed")})
    return run_settings(
        method=group["method"],
        epsilon=epsilon_of_label(group["eps"]),
        seed=seed_number(wildcards),
        hparams=json.loads(finetune_hparams(wildcards)),
        backbone_settings=backbone_settings(json.loads(backbone_spec(wildcards))),
    )


def planned_releases():
    """Output path -> settings of every release the study plans: fine-tunes, private statistics, audit runs."""
    planned = {}
    for group in all_groups():
        for task in config["backbones"][group["backbone"]]["tasks"]:
            planned[TV.format(task=task, **group)] = fine_tune_settings(group, task)
        for name in group["merges"]:
            statistic = config["merge"][name].get("statistics", {})
            if operator_of(name) in NEEDS_STATISTICS and statistic.get("data") == "private":
                planned[STATISTICS.format(operator=name, **group)] = statistics_settings(
                    kind=NEEDS_STATISTICS[operator_of(name)],
                    examples=statistic.get("examples", 256),
                    clip_norm=statistic["clip_norm"],
                    epsilon=statistic["epsilon"],
                )
    for group in audit_groups():
        for kind in AUDIT["kinds"]:
            for task in config["backbones"][group["backbone"]]["tasks"]:
                planned[AUDIT_ROW.format(task=task, kind=kind, **group)] = audit_run_settings(
                    fine_tune_settings(group, task),
                    kind=kind,
                    canaries=AUDIT["canaries"][kind],
                    groups=AUDIT["groups"].get(task, {}) if kind == "black_box" else {},
                )
    return planned


if workflow.is_main_process and os.path.exists(RELEASE_LOG) and not config["privacy"]["replace_releases"]:
    _changed = changed_settings(RELEASE_LOG, planned_releases())
    if _changed:
        _path, _differences = _changed[0]
        raise ConfigError(
            f"{len(_changed)} release(s) would be made again where this study already released with other "
            f"settings, e.g. {_path}: {'; '.join(_differences[:3])}. A release is forever: the earlier releases may "
            "be published, and their budget is spent whatever happens to their files. Restore the settings they "
            "were made with, write to another results folder (results:), or set privacy: {replace_releases: true} "
            "to release anyway (the ledger then composes both)."
        )
