"""`dpmerge mix`: one task's releases at several budgets in, one release at the target epsilon out, with a record
the ledger recomputes from its components; bad inputs refused by name."""

import math

import pytest
import torch

from dpmerge.artifacts import load_tensors, read_metadata, save_released, tensors_sha256
from dpmerge.cli import main
from dpmerge.privacy.accounting import calibrate_noise_multiplier
from dpmerge.privacy.ledger import build_ledger, check_ledger
from dpmerge.privacy.ledger_log import check_against_log
from dpmerge.privacy.release_log import read_entries, relative_path
from dpmerge.stages.mix import combine, draw_component, mix

N, RATE, STEPS = 500, 0.1, 40


def release(folder, epsilon, task="digits", **changes):
    """A task vector and head whose records are those of a run at `epsilon` (the tensors are stand-ins)."""
    sigma = calibrate_noise_multiplier(epsilon, 1 / N, RATE, STEPS)
    record = {"method": "naive_dp", "target_epsilon": epsilon, "spent_epsilon": epsilon * 0.999, "delta": 1 / N,
              "noise_multiplier": sigma, "effective_noise_multiplier": sigma, "sample_rate": RATE, "steps": STEPS,
              "clip_norm": 1.0, "queries_per_step": 1, "steps_by_queries": {"1": STEPS}, "accountant": "pld",
              "sampling": "poisson", "neighbouring": "replace_one", "randomness": "keyed", "seed": 0, "rho": 0.0,
              "anchor_lambda": 0.0, "pretrained_sha256": "w0", "num_train_examples": N, **changes}
    generator = torch.Generator().manual_seed(int(epsilon * 100) + 1000 * record["seed"])
    where = {"backbone": "toy", "task": task}
    name = f"{task}_eps{epsilon:g}" + (f"_s{record['seed']}" if record["seed"] else "")
    vector, head = folder / f"{name}.safetensors", folder / f"{name}_head.safetensors"
    save_released(vector, {"w": torch.randn(3, 2, generator=generator)}, record, {**where, "artifact": "task_vector"})
    save_released(head, {"h": torch.randn(2, generator=generator)}, record, {**where, "artifact": "head"})
    return str(vector), str(head)


def run_mix(tmp_path, components, target=3.0, **kwargs):
    vectors, heads = map(list, zip(*components))
    out_vector, out_head = tmp_path / "mixed.safetensors", tmp_path / "mixed_head.safetensors"
    mixture = mix(task_vectors=vectors, heads=heads, target_epsilon=target, delta=kwargs.pop("delta", None),
                  utilities=kwargs.pop("utilities", None), study_key=str(tmp_path / "study.key"), rng="keyed",
                  out_vector=str(out_vector), out_head=str(out_head))
    return mixture, out_vector, out_head


@pytest.mark.slow
def test_a_mixture_releases_one_component_as_it_is_with_a_record_the_ledger_recomputes(tmp_path):
    components = [release(tmp_path, 1.0), release(tmp_path, 8.0)]
    mixture, out_vector, out_head = run_mix(tmp_path, components, target=3.0)
    chosen = mixture["selected"]
    assert 0 < mixture["probabilities"][0] < 1 and sum(mixture["probabilities"]) == pytest.approx(1.0)
    tensors, record = load_tensors(out_vector)
    assert torch.equal(tensors["w"], load_tensors(components[chosen][0])[0]["w"])
    assert torch.equal(load_tensors(out_head)[0]["h"], load_tensors(components[chosen][1])[0]["h"])
    assert record["target_epsilon"] == 3.0 and 0 < record["spent_epsilon"] <= 3.0
    assert record["delta"] == pytest.approx(1 / N) and record["mixture"]["component_epsilons"] == [1.0, 8.0]
    ledger = build_ledger([str(out_vector)])
    assert check_ledger(ledger) == []
    assert ledger["recomputed_epsilon"].iloc[0] == pytest.approx(record["spent_epsilon"], rel=1e-9)
    assert math.isnan(ledger["independent_epsilon"].iloc[0])
    # the same study key and mixture draw the same component: the draw is keyed, not fresh
    assert run_mix(tmp_path, components, target=3.0)[0]["selected"] == chosen


@pytest.mark.slow
def test_the_ledger_catches_a_mixture_whose_record_claims_less_than_its_components_give(tmp_path):
    components = [release(tmp_path, 1.0), release(tmp_path, 8.0)]
    _, out_vector, _ = run_mix(tmp_path, components, target=3.0)
    tensors, record = load_tensors(out_vector)
    tampered = tmp_path / "tampered.safetensors"
    record["mixture"]["probabilities"] = [0.0, 1.0]  # all weight on the epsilon = 8 release, claim unchanged
    save_released(tampered, tensors, record)
    problems = check_ledger(build_ledger([str(tampered)]))
    assert any("spends epsilon" in p for p in problems), problems


def run_combine(tmp_path, components, target=2.0, weights=None, seed=0, release_log=None):
    vectors, heads = map(list, zip(*components))
    out_vector, out_head = tmp_path / "combined.safetensors", tmp_path / "combined_head.safetensors"
    combination = combine(task_vectors=vectors, heads=heads, target_epsilon=target, weights=weights, seed=seed,
                          out_vector=str(out_vector), out_head=str(out_head), release_log=release_log)
    return combination, out_vector, out_head


@pytest.mark.slow
def test_mixtures_and_combinations_are_logged_as_functions_of_their_components_and_never_composed(tmp_path):
    components = [release(tmp_path, 1.0), release(tmp_path, 8.0)]
    _, mixed, _ = run_mix(tmp_path, components, target=3.0)
    run_mix(tmp_path, components, target=3.0)  # the same mixture again: the same mechanism, logged again
    log = tmp_path / "releases.jsonl"  # beside the study key the mixture drew from
    repetitions = [release(tmp_path, 1.0, seed=s) for s in (1, 2)]
    _, combined, _ = run_combine(tmp_path, repetitions, target=2.0, release_log=str(log))
    entries = read_entries(log)
    assert [sorted(e["post_processing_of"]) for e in entries] == [
        sorted(relative_path(log, p) for pair in components for p in pair)] * 2 + [
        sorted(relative_path(log, p) for pair in repetitions for p in pair)]
    assert entries[0]["mechanism"] == entries[1]["mechanism"] != entries[2]["mechanism"]
    logged = {f["path"]: f["tensors_sha256"] for e in entries for f in e["files"]}
    for path in (mixed, combined):
        assert logged[relative_path(log, path)] == tensors_sha256(load_tensors(path)[0])
    # their components' budgets are composed already (each is a release of its own): the ledger adds nothing
    assert check_against_log(log, entries, [])[1] == []
    # a combination by hand without a log writes the same release and logs nothing
    _, by_hand, _ = run_combine(tmp_path / "elsewhere", repetitions, target=2.0)
    assert tensors_sha256(load_tensors(by_hand)[0]) == logged[relative_path(log, combined)]
    assert len(read_entries(log)) == 3


def independent_composition(records, delta):
    """dp_accounting's replace-one PLD composing the components' Poisson-subsampled Gaussian steps, written out
    here on a finer grid than the stage's."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE,
                                                      value_discretization_interval=1e-4)
    for record in records:
        event = dp_accounting.PoissonSampledDpEvent(record["sample_rate"],
                                                    dp_accounting.GaussianDpEvent(record["noise_multiplier"]))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, record["steps"]))
    return accountant.get_epsilon(delta)


@pytest.mark.slow
def test_a_combination_releases_the_average_of_independent_repetitions_at_their_composition(tmp_path):
    components = [release(tmp_path, 1.0, seed=s) for s in (0, 1, 2)]
    combination, out_vector, out_head = run_combine(tmp_path, components, target=2.0, seed=4)
    tensors, record = load_tensors(out_vector)
    expected = sum(load_tensors(v)[0]["w"] for v, _ in components) / 3
    assert torch.allclose(tensors["w"], expected, atol=1e-7)
    assert torch.allclose(load_tensors(out_head)[0]["h"], sum(load_tensors(h)[0]["h"] for _, h in components) / 3,
                          atol=1e-7)
    assert combination["component_seeds"] == [0, 1, 2] and combination["weights"] == pytest.approx([1 / 3] * 3)
    assert record["seed"] == 4 and record["target_epsilon"] == 2.0 and record["method"] == "naive_dp"
    # three runs at epsilon 1 compose to more than one of them, less than their sum; an independent accountant agrees
    records = [read_metadata(v) for v, _ in components]
    assert 1.0 < record["spent_epsilon"] <= 2.0
    assert record["spent_epsilon"] == pytest.approx(independent_composition(records, 1 / N), rel=2e-2)
    ledger = build_ledger([str(out_vector)])
    assert check_ledger(ledger) == []
    assert ledger["recomputed_epsilon"].iloc[0] == pytest.approx(record["spent_epsilon"], rel=1e-9)
    # weights are any linear combination; the epsilon is the same composition
    weighted, _, _ = run_combine(tmp_path, components[:2], target=2.0, weights=[0.75, 0.25])
    assert torch.allclose(load_tensors(tmp_path / "combined.safetensors")[0]["w"],
                          0.75 * load_tensors(components[0][0])[0]["w"] + 0.25 * load_tensors(components[1][0])[0]["w"],
                          atol=1e-7)
    assert weighted["weights"] == [0.75, 0.25]


def test_the_ledger_catches_a_combination_that_claims_less_than_its_composition(tmp_path):
    _, out_vector, _ = run_combine(tmp_path, [release(tmp_path, 1.0, seed=s) for s in (0, 1)], target=2.0)
    tensors, record = load_tensors(out_vector)
    tampered = tmp_path / "tampered.safetensors"
    record["spent_epsilon"] = record["target_epsilon"] = 1.05  # one run's worth, not two
    save_released(tampered, tensors, record)
    problems = check_ledger(build_ledger([str(tampered)]))
    assert any("spends epsilon" in p or "exceeds" in p for p in problems), problems


@pytest.mark.slow
def test_a_combination_that_cannot_be_made_is_refused_by_name(tmp_path):
    first, second = release(tmp_path, 1.0, seed=0), release(tmp_path, 1.0, seed=1)
    with pytest.raises(ValueError, match="repeat a seed"):
        run_combine(tmp_path, [first, first])
    with pytest.raises(ValueError, match="disagree on target_epsilon"):
        run_combine(tmp_path, [first, release(tmp_path, 8.0, seed=1)], target=10.0)
    with pytest.raises(ValueError, match=r"spends 1\.\d+ > --target-epsilon 1\.1"):
        run_combine(tmp_path, [first, second], target=1.1)
    with pytest.raises(ValueError, match="needs two or more releases"):
        run_combine(tmp_path, [first])
    with pytest.raises(ValueError, match="--weights: one finite number per component"):
        run_combine(tmp_path, [first, second], weights=[1.0])
    with pytest.raises(ValueError, match="disagree on task"):
        run_combine(tmp_path, [first, release(tmp_path, 1.0, task="mnist1d", seed=1)])
    _, mixed, _ = run_mix(tmp_path, [first, release(tmp_path, 8.0)])
    with pytest.raises(ValueError, match="is itself a mixture"):
        run_combine(tmp_path, [second, (str(mixed), str(tmp_path / "mixed_head.safetensors"))])
    assert not (tmp_path / "combined.safetensors").exists()


def test_the_inverse_cdf_draw_gives_each_component_its_probability():
    probabilities = [0.25, 0.0, 0.75]
    draws = [draw_component(probabilities, u / 1000) for u in range(1000)]
    assert draws.count(0) == 250 and draws.count(1) == 0 and draws.count(2) == 750
    assert draw_component([0.5, 0.5], 1.0 - 1e-17) == 1


@pytest.mark.slow
def test_bad_components_and_settings_are_refused_by_name(tmp_path):
    low, high = release(tmp_path, 1.0), release(tmp_path, 8.0)
    other_task = release(tmp_path, 8.0, task="mnist1d")
    with pytest.raises(ValueError, match="disagree on task"):
        run_mix(tmp_path, [low, other_task])
    with pytest.raises(ValueError, match=r"is not the head of .*differ in .*spent_epsilon"):
        run_mix(tmp_path, [low, (high[0], low[1])])
    with pytest.raises(ValueError, match="one head per task vector"):
        mix(task_vectors=[low[0], high[0]], heads=[low[1]], target_epsilon=3.0, delta=None, utilities=None,
            study_key=str(tmp_path / "k"), rng="keyed", out_vector=str(tmp_path / "v"), out_head=str(tmp_path / "h"))
    with pytest.raises(ValueError, match=r"--delta must be in \(0, 1/N\]"):
        run_mix(tmp_path, [low, high], delta=0.5)
    with pytest.raises(ValueError, match="no selection reaches the target"):
        run_mix(tmp_path, [low, high], target=0.2)
    with pytest.raises(ValueError, match="--utilities: one per component"):
        run_mix(tmp_path, [low, high], utilities=[1.0])
    _, mixed, _ = run_mix(tmp_path, [low, high])
    with pytest.raises(ValueError, match="is itself a mixture"):
        run_mix(tmp_path, [low, (str(mixed), str(tmp_path / "mixed_head.safetensors"))])
    assert not (tmp_path / "nothing.safetensors").exists()


@pytest.mark.slow
def test_the_command_line_reports_a_bad_target_without_a_traceback(tmp_path, capsys):
    low, high = release(tmp_path, 1.0), release(tmp_path, 8.0)
    with pytest.raises(SystemExit, match="error: --target-epsilon must be a positive number"):
        main(["mix", "--task-vectors", low[0], high[0], "--heads", low[1], high[1], "--target-epsilon", "nan",
              "--study-key", str(tmp_path / "k"), "--out-vector", str(tmp_path / "v.safetensors"),
              "--out-head", str(tmp_path / "h.safetensors")])
    assert read_metadata(low[0])["task"] == "digits"


@pytest.mark.slow
@pytest.mark.parametrize("mix_config,message", [
    ({"targets": [6], "methods": ["nonprivate"]}, "mix.methods: 'nonprivate' must be one of the configured private"),
    ({"targets": [6], "methods": ["naive_dp"], "operator": "fisher"}, "mix.operator: 'fisher' needs data statistics"),
    ({"targets": [6], "methods": ["naive_dp"], "operator": "tsv_m"}, "mix.operator: 'tsv_m' is not among"),
    ({"targets": [3], "methods": ["naive_dp"]}, "mix.targets: 3 on effnet needs a release of naive_dp at a smaller"),
    # effnet releases naive_dp at 4 and 8: a target at the smallest budget has nothing cheaper to mix in
    ({"targets": [4], "methods": ["naive_dp"]}, "mix.targets: 4 on effnet needs a release of naive_dp at a smaller"),
    # TINY has one seed; the combination cases below give it two where the seed count is not what is refused
    ({"targets": [6], "methods": ["naive_dp"], "combine": {"copies": 2, "budget": 4, "target": 6}},
     "mix.combine.copies: 2 must be 2 or more and at most the number of seeds (1)"),
    ({"targets": [6], "methods": ["naive_dp"], "combine": {"copies": 1, "budget": 4, "target": 6}, "seeds": 2},
     "mix.combine.copies: 1 must be 2 or more"),
    ({"targets": [6], "methods": ["naive_dp"], "combine": {"copies": 2, "budget": 4, "target": 7}, "seeds": 2},
     "mix.combine.target: 7 must be one of mix.targets [6]"),
    ({"targets": [6], "methods": ["naive_dp"], "combine": {"copies": 2, "budget": 8, "target": 6}, "seeds": 2},
     "mix.combine.budget: 8 must be below mix.combine.target 6"),
    ({"targets": [6], "methods": ["naive_dp"], "combine": {"copies": 2, "budget": 2, "target": 6}, "seeds": 2},
     "mix.combine.budget: 2 is not a released budget of naive_dp on effnet"),
])
def test_a_mixture_that_cannot_be_built_is_refused_with_the_config(mix_config, message):
    import re

    import yaml

    from dpmerge.config_check import ConfigError, check_config
    from workflow_runs import TINY

    config = yaml.safe_load(yaml.safe_dump(TINY))
    config["merge"]["task_arithmetic"] = {}
    config["seeds"] = list(range(mix_config.pop("seeds", 1)))
    config["mix"] = {"operator": "task_arithmetic", **mix_config}
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(config)


def test_released_budgets_are_the_main_grids_and_the_sweeps():
    import yaml

    from dpmerge.config_check import check_config, released_budgets
    from workflow_runs import TINY

    config = yaml.safe_load(yaml.safe_dump(TINY))
    check_config(config)
    assert released_budgets(config, "effnet", "naive_dp") == [4.0, 8.0]
    assert released_budgets(config, "minilm", "naive_dp") == [4.0]
    assert released_budgets(config, "effnet", "dp_sam") == []


@pytest.mark.slow
def test_a_mixture_of_add_remove_releases_is_bounded_by_their_public_size_and_never_carries_n(tmp_path):
    components = [release(tmp_path, e, neighbouring="add_remove", num_train_examples=None, public_n=2 * N,
                          delta=1 / (2 * N))
                  for e in (1.0, 8.0)]
    mixture, out_vector, _ = run_mix(tmp_path, components, target=3.0)
    record = read_metadata(out_vector)
    assert record["num_train_examples"] is None and record["public_n"] == 2 * N
    assert check_ledger(build_ledger([str(out_vector)])) == []
    with pytest.raises(ValueError, match=r"--delta must be in \(0, 1/public_n\]"):
        run_mix(tmp_path, components, target=3.0, delta=1.5 / (2 * N))
