# ACE-Merging under DP (config ace_study:; rules in workflow/rules/ace.smk): on every merged release group of the
# main grid, what ACE sees in the released task vectors (its gate, the noise floor), then one report comparing
# the configured merge entries across budgets. Reading releases is post-processing: it spends no privacy.
from dpmerge.catalog import OPERATOR_SPECS

ACE = config["ace_study"]
ACE_GATES = result("diagnostics/ace_gates/{backbone}/{eps}/{method}/{seed}.parquet")
ACE_TABLE = result("tables/ace_under_dp")
FIGURE_ACE = result("figures/ace_under_dp")


def ace_groups():
    """The main grid's release groups that merge (not the Pretrained row's head-only runs)."""
    if not ACE["operators"]:
        return []
    return [g for g in release_grid() if not head_only(g["method"])]


def ace_labels():
    """Display names: an ACE entry by its stage (E1-E4, the ACE paper's Table 4 rows) and prior."""
    labels = {}
    for name in ACE["operators"]:
        if operator_of(name) == "ace":
            settings = {**OPERATOR_SPECS["ace"].defaults, **hyperparameters_of(name)}
            prior = ", mean-covariance prior" if settings["prior"] == "mean_cov" else ""
            labels[name] = f"ACE E{settings['stage']}{prior}"
    return json.dumps(labels, sort_keys=True)


def ace_targets():
    if not ACE["operators"]:
        return []
    tables = [f"{ACE_TABLE}_gates", f"{ACE_TABLE}_scores"]
    return [t + ext for t in tables for ext in (".parquet", ".md", ".tex")] + [
        FIGURE_ACE + ext for ext in FIGURE_EXTENSIONS
    ]
