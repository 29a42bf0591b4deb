# The audits' paths and input functions (rules in workflow/rules/audit.smk). Included before the ledger's rule:
# the ledger composes the audit runs with their tasks' releases.

AUDIT_ROW = result("audits/individual/{backbone}/{eps}/{method}/{seed}/{task}.{kind}.parquet")
# The audit run's vector, head and canaries with their secret coins: private, kept for the merged audits.
AUDIT_RUN = result("private/audits/{backbone}/{eps}/{method}/{seed}/{task}.{kind}.pt")
AUDIT_MERGED = result("audits/merged/{backbone}/{eps}/{method}/{seed}/{operator}.{kind}.parquet")
AUDIT_TABLE = result("tables/audit")
AUDIT_TABLE_EXTENSIONS = (".parquet", ".md", ".tex")  # report/audit.py writes these
FIGURE_AUDIT = result("figures/audit")
AUDIT = config["audit"]


def audit_groups():
    """The audited release groups: the configured methods at the configured budgets (the non-private method at
    its one label), on the first `audit.seeds` seeds."""
    if not AUDIT["methods"]:
        return []
    budgets = [eps_label(e) for e in AUDIT["epsilons"]] or PRIVATE_EPS
    seeds = SEEDS[: AUDIT["seeds"]]
    return [
        g
        for g in release_grid()
        if g["method"] in AUDIT["methods"]
        and (g["eps"] in budgets or g["eps"] == "epsinf")
        and g["seed"] in seeds
        and (not AUDIT["backbones"] or g["backbone"] in AUDIT["backbones"])
    ]


def all_audit_rows():
    """Every audit row: each audited task model, and each audited merge of a group."""
    rows = []
    for g in audit_groups():
        for kind in AUDIT["kinds"]:
            rows += [AUDIT_ROW.format(task=t, kind=kind, **g) for t in config["backbones"][g["backbone"]]["tasks"]]
            rows += [AUDIT_MERGED.format(operator=o, kind=kind, **g) for o in AUDIT["merge"]]
    return rows


def audit_targets():
    if not audit_groups():
        return []
    return [AUDIT_TABLE + ext for ext in AUDIT_TABLE_EXTENSIONS] + [FIGURE_AUDIT + ext for ext in FIGURE_EXTENSIONS]


def audit_group_flags(wildcards):
    """--group flags of a black-box audit of a task with configured groups (config audit.groups)."""
    if wildcards.kind != "black_box":
        return ""
    groups = AUDIT["groups"].get(wildcards.task, {})
    return " ".join(f"--group {shlex.quote(name + '=' + ','.join(classes))}" for name, classes in groups.items())


def audit_operator_params(wildcards):
    name = wildcards.operator
    flags = [f"--method {merge_operator(name)}"]
    flags += [f"--param {key}={json.dumps(value)}" for key, value in sorted(merge_hyperparameters(name).items())]
    return " ".join(flags)
