# The audits' paths and input functions (rules in workflow/rules/audit.smk). Included before the ledger's rule:
# the ledger composes the audit runs with their tasks' releases.

AUDIT_ROW = result("audits/individual/{backbone}/{eps}/{method}/{seed}/{task}.{kind}.parquet")
# The audit run's vector, head and canaries with their secret coins: private, kept for the merged audits.
AUDIT_RUN = result("private/audits/{backbone}/{eps}/{method}/{seed}/{task}.{kind}.pt")
AUDIT_MERGED = result("audits/merged/{backbone}/{eps}/{method}/{seed}/{operator}.{kind}.parquet")
# Every task's canary scores on a merged model with their coins: private, kept for the pooled audit.
AUDIT_MERGED_SCORES = result("private/audits/merged/{backbone}/{eps}/{method}/{seed}/{operator}.{kind}.pt")
# One audit of a release group: every task's and audited seed's canaries pooled, individual and merged.
AUDIT_POOLED = result("audits/pooled/{backbone}/{eps}/{method}.{kind}.parquet")
AUDIT_TABLE = result("tables/audit")
AUDIT_TABLE_EXTENSIONS = (".parquet", ".md", ".tex")  # report/audit.py writes these
FIGURE_AUDIT = result("figures/audit")
AUDIT = config["audit"]


def audit_groups():
    """The audited release groups: the configured methods at the configured budgets (empty: every budget the
    main grid or the epsilon sweep releases; the non-private method at its one label), on the first
    `audit.seeds` seeds."""
    if not AUDIT["methods"]:
        return []
    budgets = [eps_label(e) for e in AUDIT["epsilons"]]
    return [
        g
        for g in release_grid() + epsilon_sweep_grid()
        if g["method"] in AUDIT["methods"]
        and (not budgets or g["eps"] in budgets or g["eps"] == NONPRIVATE_LABEL)
        and g["seed"] in seeds_of(g["backbone"])[: AUDIT["seeds"]]
        and (not AUDIT["backbones"] or g["backbone"] in AUDIT["backbones"])
    ]


def audit_settings():
    """(backbone, eps, method) of every audited release group, each once whatever its seeds."""
    unique = {(g["backbone"], g["eps"], g["method"]): None for g in audit_groups()}
    return [dict(backbone=b, eps=e, method=m) for b, e, m in unique]


def all_audit_rows():
    """Every audit row: each audited task model, each audited merge of a group, and each group's pooled audit."""
    rows = []
    for g in audit_groups():
        for kind in AUDIT["kinds"]:
            rows += [AUDIT_ROW.format(task=t, kind=kind, **g) for t in config["backbones"][g["backbone"]]["tasks"]]
            rows += [AUDIT_MERGED.format(operator=o, kind=kind, **g) for o in AUDIT["merge"]]
    rows += [AUDIT_POOLED.format(kind=kind, **s) for s in audit_settings() for kind in AUDIT["kinds"]]
    return rows


def _audited_seeds(wildcards):
    return [
        g["seed"]
        for g in audit_groups()
        if (g["backbone"], g["eps"], g["method"]) == (wildcards.backbone, wildcards.eps, wildcards.method)
    ]


def pooled_audit_runs(wildcards):
    """The kept runs a release group's pooled audit reads: every task, every audited seed."""
    tasks = config["backbones"][wildcards.backbone]["tasks"]
    return [AUDIT_RUN.format(task=t, seed=s, **wildcards) for s in _audited_seeds(wildcards) for t in tasks]


def pooled_merged_scores(wildcards):
    """The kept merged scores a release group's pooled audit reads: every audited merge, every audited seed."""
    return [
        AUDIT_MERGED_SCORES.format(operator=o, seed=s, **wildcards)
        for s in _audited_seeds(wildcards)
        for o in AUDIT["merge"]
    ]


def audit_targets():
    if not audit_groups():
        return []
    return [AUDIT_TABLE + ext for ext in AUDIT_TABLE_EXTENSIONS] + [FIGURE_AUDIT + ext for ext in FIGURE_EXTENSIONS]


def answer_audit_table():
    """The audits' table the answer page sums up, when the study audits."""
    return [f"{AUDIT_TABLE}.parquet"] if audit_groups() else []


def audit_group_flags(wildcards):
    """--group flags of a black-box audit of a task with configured groups (config audit.groups)."""
    if wildcards.kind != "black_box":
        return ""
    groups = AUDIT["groups"].get(wildcards.task, {})
    return " ".join(f"--group {shlex.quote(name + '=' + ','.join(classes))}" for name, classes in groups.items())


def audit_operator_params(wildcards):
    name = wildcards.operator
    flags = [f"--method {operator_of(name)}"]
    flags += [f"--param {key}={json.dumps(value)}" for key, value in sorted(hyperparameters_of(name).items())]
    return " ".join(flags)
