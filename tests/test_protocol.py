"""The training-budget protocol: a validation split carved out of the training subset (the test split unread),
and the choice rule applied to Table 1's individual rows."""

import numpy as np
import pandas as pd
import pytest

from dpmerge.data.loading import load_task
from dpmerge.report.protocol import choose


def test_the_validation_split_is_held_out_of_the_training_subset_and_the_test_split_is_not_read():
    full = load_task("digits", image_size=8, max_train=200, max_test=50, seed=0)
    held = load_task("digits", image_size=8, max_train=200, max_test=50, seed=0, validation_fraction=0.2)
    assert len(held.train_labels) == 160 and len(held.test_labels) == 40
    # every held-out and every kept example is one of the 200 training examples, none twice
    pool = {bytes(np.asarray(x).tobytes()) for x in full.train_inputs}
    kept = [bytes(np.asarray(x).tobytes()) for x in held.train_inputs]
    out = [bytes(np.asarray(x).tobytes()) for x in held.test_inputs]
    assert set(kept) <= pool and set(out) <= pool and not set(kept) & set(out)
    test = {bytes(np.asarray(x).tobytes()) for x in full.test_inputs}
    assert not set(out) & test
    with pytest.raises(ValueError, match="validation_fraction"):
        load_task("digits", image_size=8, max_train=200, validation_fraction=1.5)


def table(**averages):
    labels = {"naive_dp": "DP", "dp_merging": "DP-Merging", "dp_sam": "DP-Merging w/o alignment",
              "dp_anchor": "DP-Merging w/o flatness", "nonprivate": "Non-private"}
    return pd.DataFrame([{"row": f"{labels[m]} Individual", "Avg.": v} for m, v in averages.items()])


def test_each_kind_takes_the_candidate_with_the_best_mean_over_the_private_methods():
    candidates = {"a": {"kind": "k1", "lr": 1e-3}, "b": {"kind": "k1", "lr": 5e-3}, "c": {"kind": "k2", "lr": 2e-3}}
    tables = {"a": table(naive_dp=50, dp_merging=40, nonprivate=99),  # pooled 45: the non-private row is ignored
              "b": table(naive_dp=42, dp_merging=50),  # pooled 46
              "c": table(naive_dp=10)}
    frame = choose(candidates, tables).set_index("candidate")
    assert frame.loc["a", "pooled"] == 45 and frame.loc["b", "pooled"] == 46
    assert list(frame["chosen"]) == [False, True, True]
    with pytest.raises(ValueError, match="candidate d: its Table 1 has no individual row of DP or"):
        choose({"a": {"kind": "k"}, "d": {"kind": "k"}}, {"a": table(naive_dp=50), "d": table(nonprivate=80)})


def test_a_run_of_the_reference_alone_takes_the_best_reference_whatever_it_costs():
    candidates = {"short": {"kind": "k", "epochs": 2.0}, "long": {"kind": "k", "epochs": 5.0},
                  "slow": {"kind": "k", "epochs": 5.0, "lr": 3e-4}}
    tables = {"short": table(nonprivate=80.5), "long": table(nonprivate=81.0), "slow": table(nonprivate=70.0)}
    frame = choose(candidates, tables).set_index("candidate")
    assert frame.loc["long", "pooled"] == 81.0 and list(frame["chosen"]) == [False, True, False]
    assert list(frame["tied"]) == [False, True, False]  # one method: no standard error, so nothing ties
    no_cells = pd.DataFrame({"backbone": ["short"], "method": ["nonprivate"], "meets_threshold": [False]})
    assert "carries signal" not in choose(candidates, tables, no_cells)  # the criterion is the private methods'
    with pytest.raises(ValueError, match="has no individual row of Non-private"):
        choose({"d": {"kind": "k"}}, {"d": pd.DataFrame({"row": [], "Avg.": []})})


def test_the_cheapest_candidate_within_one_standard_error_of_the_best_is_chosen():
    settings = {"kind": "k", "trainable_blocks": 1}
    candidates = {"best": {**settings, "epochs": 2.0}, "cheap_tied": {**settings, "epochs": 1.0},
                  "cheap_behind": {**settings, "epochs": 1.0, "lr": 0.1}, "all_blocks": {**settings,
                  "trainable_blocks": "all", "epochs": 1.0}}
    tables = {"best": table(naive_dp=50, dp_merging=40, dp_sam=46, dp_anchor=44),  # pooled 45
              # gaps to best +6, -4, +2, +0: mean 1.0, standard error sqrt(52/3)/2 = 2.08 -> tied
              "cheap_tied": table(naive_dp=44, dp_merging=44, dp_sam=44, dp_anchor=44),
              # gaps +3, +3.5, +2.5, +3: mean 3.0, standard error 0.20 -> behind, though cheap
              "cheap_behind": table(naive_dp=47, dp_merging=36.5, dp_sam=43.5, dp_anchor=41),
              "all_blocks": table(naive_dp=50, dp_merging=40, dp_sam=46, dp_anchor=44)}  # level, costs most
    frame = choose(candidates, tables).set_index("candidate")
    assert frame.loc["cheap_tied", "gap to best"] == pytest.approx(1.0)
    assert frame.loc["cheap_tied", "gap SE"] == pytest.approx((52 / 3) ** 0.5 / 2)
    assert list(frame["tied"]) == [True, True, False, True]
    assert list(frame["chosen"]) == [False, True, False, False]
    assert frame.loc["all_blocks", "cost"] == float("inf")


def test_equal_costs_go_to_the_higher_pooled_score_and_one_method_shows_no_tie():
    candidates = {"a": {"kind": "k", "trainable_blocks": 1, "epochs": 1.0},
                  "b": {"kind": "k", "trainable_blocks": 1, "epochs": 1.0},
                  "c": {"kind": "k", "trainable_blocks": 1, "epochs": 0.5}}
    # a's gaps to the best (b): +2, -1 -> mean 0.5, standard error 1.5 -> tied at the same cost
    tables = {"a": table(naive_dp=40, dp_merging=45), "b": table(naive_dp=42, dp_merging=44),
              "c": table(naive_dp=42)}  # shares one method with the best: its gap has no standard error
    frame = choose(candidates, tables).set_index("candidate")
    assert list(frame["tied"]) == [True, True, False]
    assert list(frame["chosen"]) == [False, True, False]


def signal(cells):
    """The signal check's frame: per candidate, (method, meets its threshold) for one task each."""
    return pd.DataFrame([{"backbone": candidate, "task": f"t{index}", "method": method, "meets_threshold": met}
                         for candidate, rows in cells.items() for index, (method, met) in enumerate(rows)])


def test_the_signal_criterion_chooses_the_cheapest_candidate_whose_every_task_learns():
    """The criterion outranks the score rule: 'cheap' ties with the best but one task of its DP-Merging models
    stays near chance; 'learns' costs more and scores lower but every cell meets the threshold."""
    settings = {"kind": "k", "trainable_blocks": 1}
    candidates = {"best": {**settings, "epochs": 3.0}, "cheap": {**settings, "epochs": 1.0},
                  "learns": {**settings, "epochs": 2.0, "head_lr": 0.01}}
    tables = {"best": table(naive_dp=50, dp_merging=50), "cheap": table(naive_dp=50, dp_merging=49),
              "learns": table(naive_dp=40, dp_merging=40)}
    cells = {"best": [("naive_dp", True), ("dp_merging", True), ("nonprivate", False)],
             "cheap": [("naive_dp", True), ("dp_merging", False)],
             "learns": [("naive_dp", True), ("dp_merging", True)]}
    frame = choose(candidates, tables, signal(cells)).set_index("candidate")
    # the non-private row is no private cell: 'best' meets 2 of 2
    assert list(frame["signal cells met"]) == ["2/2", "1/2", "2/2"]
    assert list(frame["chosen"]) == [False, False, True] and frame.loc["learns", "head_lr"] == 0.01
    # where no candidate carries signal, the score rule chooses, and the page says so
    none = {name: [("naive_dp", False)] for name in candidates}
    frame = choose(candidates, tables, signal(none)).set_index("candidate")
    assert list(frame["chosen"]) == [False, True, False]
    from dpmerge.report.protocol import to_markdown

    assert "For k no candidate met it" in to_markdown(frame.reset_index(), 1)
