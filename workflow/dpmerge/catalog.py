"""Names and defaults the workflow needs before any job, without torch: what the Snakefile, its rules and the
config check import (tests/test_structure.py checks it loads neither torch nor numpy). It states nothing itself:
it gathers the torch-free registries and helpers of the rooms below, so each name keeps one home.
"""

from __future__ import annotations

from dpmerge.config_check import (  # noqa: F401
    ConfigError,
    check_config,
    finetune_settings,  # noqa: F401
    merge_hyperparameters,
    merge_operator,
)
from dpmerge.config_fields import denoised_counterpart  # noqa: F401
from dpmerge.config_sampling import sampling_limits  # noqa: F401
from dpmerge.data.registry import TASKS  # noqa: F401 - every task, embedded and the paper's
from dpmerge.epsilon import NONPRIVATE_LABEL, eps_label, epsilon_of_label, epsilon_value  # noqa: F401
from dpmerge.merge.specs import DENOISERS, NEEDS_STATISTICS  # noqa: F401 - merge operators, denoisers
from dpmerge.merge.specs import SPECS as OPERATOR_SPECS  # noqa: F401
from dpmerge.methods import (  # noqa: F401 - fine-tuning methods
    BASELINE,
    METHODS,
    PROPOSED,
    SWEPT_PARAMETERS,
    parse_label,
    sweep_label,
)
from dpmerge.models.registry import BACKBONES  # noqa: F401 - the catalog's backbone kinds
from dpmerge.privacy.release_log import (  # noqa: F401
    audit_run_settings,
    backbone_settings,
    changed_settings,
    run_settings,
    statistics_settings,
)
from dpmerge.report.captions import (  # noqa: F401 - the tables' captions and the figures' titles
    ablation_table_caption,
    epsilon_sweep_table_caption,
    gap_bound_figure_title,
    interpolation_figure_title,
    landscape_figure_title,
    multitask_table_caption,
    operators_table_caption,
    sensitivity_table_caption,
    sharpness_drift_figure_title,
)
