"""docs/architecture.md's recipes, followed to the letter on a copy of the workflow: a throwaway merge operator
(its spec in merge/specs.py and its kernel in a family module) and a throwaway fine-tuning method (its spec in
methods.py and its step function in training/dp_step.py) are added there and nowhere else, and both are then
accepted by the config check, listed by the CLI's help and planned by a dry run of the Snakefile.
"""

import shutil
import subprocess
import sys

import pytest
import yaml

from workflow_runs import ROOT, TINY, planned_jobs

OPERATOR_SPEC = '''    OperatorSpec(
        "throwaway_mean", {"scaling": 1.0},
        "scaling times the mean of the task vectors (a recipe test's operator)",
        "Nobody et al., 2026",
        "A Throwaway Operator", "2601.00001",
    ),
'''
OPERATOR_KERNEL = '''

def _throwaway_mean_tensor(key, tensors, stats, scaling):
    """scaling * mean_t tau_t."""
    return scaling * torch.stack(tensors).mean(0)


IMPLEMENTATIONS["throwaway_mean"] = {"per_tensor": _throwaway_mean_tensor}
'''
METHOD_SPEC = '''    Method("dp_throwaway", "Throwaway", "Eq. (4) plus half the anchor (a recipe test's method)", True,
           "ablation", anchor=True),
'''
METHOD_STEP = '''

def dp_throwaway_step(query, params, anchors, features, labels, memory, *, anchor_lambda):
    return add_anchor(query(features, labels), params, anchors, 0.5 * anchor_lambda)


STEPS["dp_throwaway"] = dp_throwaway_step
'''


def insert_before(path, marker: str, text: str) -> None:
    source = path.read_text()
    assert source.count(marker) == 1, f"{path}: the recipe's place {marker!r} is not there once"
    path.write_text(source.replace(marker, text + marker))


@pytest.fixture(scope="module")
def recipe_tree(tmp_path_factory):
    """A copy of the workflow with the two recipes applied: four edits in four files."""
    tree = tmp_path_factory.mktemp("recipes")
    shutil.copy(ROOT / "Snakefile", tree / "Snakefile")
    shutil.copytree(ROOT / "envs", tree / "envs")
    shutil.copytree(ROOT / "workflow", tree / "workflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    package = tree / "workflow" / "dpmerge"
    insert_before(package / "merge" / "specs.py", ")\n\n# By name, in the order", OPERATOR_SPEC)
    with open(package / "merge" / "elementwise.py", "a") as kernels:
        kernels.write(OPERATOR_KERNEL)
    insert_before(package / "methods.py", '    Method("pretrained_head"', METHOD_SPEC)
    with open(package / "training" / "dp_step.py", "a") as steps:
        steps.write(METHOD_STEP)
    config = {**TINY, "methods": ["naive_dp", "dp_merging", "dp_throwaway"],
              "merge": {"weight_averaging": {}, "throwaway_mean": {"scaling": 0.5}},
              "tables": {"operator": "throwaway_mean"}}
    config.pop("sweeps")
    (tree / "config.yaml").write_text(yaml.safe_dump(config))
    return tree


def run_in(tree, *args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tree, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree / "workflow"), "HOME": str(tree)},
                          **kwargs)


def test_the_recipes_edit_only_the_places_they_name(recipe_tree):
    changed = sorted(
        str(path.relative_to(recipe_tree)) for path in (recipe_tree / "workflow").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
        and path.read_bytes() != (ROOT / path.relative_to(recipe_tree)).read_bytes()
    )
    assert changed == ["workflow/dpmerge/merge/elementwise.py", "workflow/dpmerge/merge/specs.py",
                       "workflow/dpmerge/methods.py", "workflow/dpmerge/training/dp_step.py"]


@pytest.mark.slow
def test_the_config_check_accepts_them(recipe_tree):
    script = ("import yaml; from dpmerge.config_check import check_config; "
              "config = yaml.safe_load(open('config.yaml')); check_config(config); print('accepted')")
    result = run_in(recipe_tree, "-c", script)
    assert result.returncode == 0 and "accepted" in result.stdout, result.stderr[-2000:]


def test_the_cli_lists_them(recipe_tree):
    merge_help = run_in(recipe_tree, "-m", "dpmerge.cli", "merge", "--help")
    assert merge_help.returncode == 0 and "throwaway_mean" in merge_help.stdout, merge_help.stderr[-2000:]
    finetune_help = run_in(recipe_tree, "-m", "dpmerge.cli", "finetune", "--help")
    assert finetune_help.returncode == 0 and "dp_throwaway" in " ".join(finetune_help.stdout.split())


@pytest.mark.slow
def test_the_registries_and_the_method_table_take_them(recipe_tree):
    script = (
        "from dpmerge.merge.registry import OPERATORS, ONE_CALL; from dpmerge.training.dp_step import STEPS; "
        "from dpmerge.methods import METHODS; from dpmerge.report.labels import METHOD_LABELS; import torch; "
        "m = ONE_CALL['throwaway_mean']([{'w': torch.ones(2)}, {'w': 3 * torch.ones(2)}], scaling=0.5); "
        "assert torch.equal(m['w'], torch.ones(2)), m; "
        "assert METHODS['dp_throwaway'].hyperparameters == ('anchor_lambda',) and 'dp_throwaway' in STEPS; "
        "print(METHOD_LABELS['dp_throwaway'])"
    )
    result = run_in(recipe_tree, "-c", script)
    assert result.returncode == 0 and result.stdout.strip() == "Throwaway", result.stderr[-2000:]


def test_a_dry_run_plans_their_jobs(recipe_tree):
    result = run_in(recipe_tree, "-m", "snakemake", "--snakefile", str(recipe_tree / "Snakefile"), "--directory",
                    str(recipe_tree), "--cores", "1", "-n", "--printshellcmds")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # the new operator reads only the releases: the release groups' jobs make it (dpmerge score-group --merges)
    assert "--method dp_throwaway" in output and '"method": "throwaway_mean"' in output
    jobs = planned_jobs(output)
    assert jobs["finetune"] == 2 * 2 * 3  # backbones x tasks x methods, one seed and one budget
