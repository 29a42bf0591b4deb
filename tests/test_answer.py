"""The answer page: DP-Merging - DP per operator with the interval Table 1 computed, read from Table 1's own
Parquet file, and the ledger's verdict as its check file says."""

import pandas as pd
import pytest

from dpmerge.report.answer import ledger_verdict, write_answer
from dpmerge.report.tables import table1, write_table


def scores(gains_by_method):
    rows = []
    for seed in range(3):
        for method, gains in gains_by_method.items():
            for operator, gain in gains.items():
                rows.append({"model": operator, "method": method, "task": "a", "score": 50.0 + gain[seed],
                             "seed": seed, "source_task": "a" if operator == "individual" else "merged"})
    return pd.DataFrame(rows)


def test_the_page_carries_table_1s_paired_intervals_and_the_ledger_verdict(tmp_path):
    frame = scores({"naive_dp": {"ties": [0, 0, 0], "weight_averaging": [0, 0, 0]},
                    "dp_merging": {"ties": [4, 5, 6], "weight_averaging": [1, 2, 3]},
                    "dp_sam": {"ties": [-1, -2, -3], "weight_averaging": [0, 0, 0]},
                    "nonprivate": {"ties": [30, 30, 30], "weight_averaging": [30, 30, 30]},
                    "pretrained_head": {"individual": [-10, -10, -10]}})
    write_table(table1(frame), tmp_path / "t1", "caption")
    ledger = tmp_path / "ledger_check.json"
    ledger.write_text('{"verdict": "PASS", "problems": []}')
    write_answer(tables={"toy, ε = 4": str(tmp_path / "t1.parquet")}, ledger=str(ledger),
                 out_markdown=str(tmp_path / "a.md"), out_rst=str(tmp_path / "a.rst"), links=["t1.html"])
    page = (tmp_path / "a.md").read_text()
    # differences 4, 5, 6: mean 5, t(0.975, 2) * 1 / sqrt(3) = 2.48 -> [+2.5, +7.5], starred
    assert "| toy, ε = 4 | TIES | 40.0 | 50.0 | +5.0 [+2.5, +7.5]* | -2.0 [-4.5, +0.5] | 80.0 |" in page
    assert "| toy, ε = 4 | Weight Averaging | 40.0 | 50.0 | +2.0 [-0.5, +4.5] | +0.0 [+0.0, +0.0] | 80.0 |" in page
    assert "w/o flatness" not in page  # dp_anchor did not run: no empty column for it
    assert "above 0 with 95 % confidence under 1 of 2 operators and below 0 under 0" in page
    # merged averages 50 (DP), 55 and 52 (DP-Merging), 48 and 50 (w/o alignment) against Pretrained's 40
    assert "toy, ε = 4: 6 of 6 private merges score above the Pretrained row (40.0); the best is DP-Merging + TIES" \
        " at 55.0." in page
    assert "Privacy ledger" in page and ": PASS." in page
    rst = (tmp_path / "a.rst").read_text()
    assert rst.startswith("Does DP-Merging merge better than naive DP?\n====") and "+5.0 [+2.5, +7.5]*" in rst


def test_the_page_knows_every_verdict_the_ledger_writes():
    from dpmerge.privacy.ledger import CHECK_VERDICTS
    from dpmerge.report.answer import LEDGER_VERDICTS

    assert LEDGER_VERDICTS == CHECK_VERDICTS


def test_the_verdict_is_the_ledger_check_files(tmp_path):
    check = tmp_path / "ledger_check.json"
    check.write_text('{"verdict": "FAIL", "problems": ["x.safetensors: epsilon above target"]}')
    assert ledger_verdict(check) == "FAIL"
    check.write_text('{"verdict": "PASS", "problems": []}')
    assert ledger_verdict(check) == "PASS"
    for text, message in (("# Privacy ledger: PASS\n", "not a ledger check file"),
                          ('{"verdict": "ok"}', "field 'verdict' must be one of PASS, FAIL, got 'ok'")):
        check.write_text(text)
        with pytest.raises(ValueError, match=message):
            ledger_verdict(check)


def test_one_seed_claims_no_confidence(tmp_path):
    rows = [{"model": "ties", "method": m, "task": "a", "score": 50.0 + g, "seed": 0, "source_task": "merged"}
            for m, g in (("naive_dp", 0), ("dp_merging", 3))]
    write_table(table1(pd.DataFrame(rows)), tmp_path / "t1", "caption")
    ledger = tmp_path / "ledger_check.json"
    ledger.write_text('{"verdict": "PASS"}')
    write_answer(tables={"toy": str(tmp_path / "t1.parquet")}, ledger=str(ledger), out_markdown=str(tmp_path / "a.md"),
                 out_rst=str(tmp_path / "a.rst"), links=[])
    page = (tmp_path / "a.md").read_text()
    assert "toy: one seed, so no intervals; DP-Merging − DP is positive under 1 of 1 operators" in page
    assert "95 % confidence" not in page


def test_the_page_sums_up_the_audits_table_with_its_largest_bounds_and_failures():
    from dpmerge.report.answer import audit_line

    nan, inf = float("nan"), float("inf")
    summary = pd.DataFrame([
        {"backbone": "effnet", "method": "naive_dp", "target_epsilon": 4.0, "claimed_epsilon": 6.1,
         "white_box individual epsilon_lb": 0.4, "white_box merged epsilon_lb": 0.1,
         "black_box individual epsilon_lb": nan, "black_box merged epsilon_lb": nan, "verdict": "PASS"},
        {"backbone": "effnet", "method": "dp_merging", "target_epsilon": 1.0, "claimed_epsilon": 1.7,
         "white_box individual epsilon_lb": 0.2, "white_box merged epsilon_lb": 0.0,
         "black_box individual epsilon_lb": 0.7, "black_box merged epsilon_lb": 0.0, "verdict": "PASS"},
        {"backbone": "minilm", "method": "nonprivate", "target_epsilon": inf, "claimed_epsilon": inf,
         "white_box individual epsilon_lb": 1.3, "white_box merged epsilon_lb": 0.5,
         "black_box individual epsilon_lb": 1.9, "black_box merged epsilon_lb": 0.4, "verdict": "PASS"},
    ])
    line = audit_line(summary)
    assert "3 settings, no bound above its claim" in line
    assert "largest private bound 0.70 (black-box individual, effnet, DP-Merging, ε = 1, claimed 1.70)" in line
    assert "largest non-private bound 1.90 (black-box individual, minilm, " in line
    summary.loc[0, "verdict"] = "FAIL"
    assert "1 with a bound above its claim (FAIL)" in audit_line(summary)


def test_dpsats_and_the_ablations_columns_join_the_page_only_where_their_runs_are_in_table_1(tmp_path):
    ledger = tmp_path / "ledger_check.json"
    ledger.write_text('{"verdict": "PASS", "problems": []}')
    base = {"naive_dp": {"ties": [0, 0, 0]}, "dp_merging": {"ties": [4, 5, 6]}}
    for name, methods in (("without", base), ("with", {**base, "dp_sat_anchor": {"ties": [1, 2, 3]}})):
        write_table(table1(scores(methods)), tmp_path / name, "caption")
        write_answer(tables={"toy": str(tmp_path / f"{name}.parquet")}, ledger=str(ledger),
                     out_markdown=str(tmp_path / f"{name}.md"), out_rst=str(tmp_path / f"{name}.rst"), links=[])
    assert "DPSAT" not in (tmp_path / "without.md").read_text()
    assert "w/o" not in (tmp_path / "without.md").read_text()
    page = (tmp_path / "with.md").read_text()
    assert "| DPSAT + anchor − DP (one query) | Non-private + operator |" in page
    assert "| toy | TIES |  | 50.0 | +5.0 [+2.5, +7.5]* | +2.0 [-0.5, +4.5] |  |" in page
    assert "DPSAT − DP (one query)" not in page  # dp_sat itself did not run


def test_the_front_page_embeds_the_forest_plot_and_docutils_renders_it_without_complaint(tmp_path):
    """The report's front page is reStructuredText: an over-long line (a base64 image on one line) or a broken
    table makes docutils print a system message in place of the page, which no assertion on the text would see."""
    from docutils.core import publish_string

    frame = scores({"naive_dp": {"ties": [0, 1, 0]}, "dp_merging": {"ties": [4, 5, 6]},
                    "pretrained_head": {"individual": [-10, -9, -10]}})
    write_table(table1(frame), tmp_path / "t1", "caption")
    ledger = tmp_path / "ledger_check.json"
    ledger.write_text('{"verdict": "PASS", "problems": []}')
    figure = [str(tmp_path / "figures" / "forest.png"), str(tmp_path / "figures" / "forest.pdf")]
    (tmp_path / "figures").mkdir()
    write_answer(tables={"toy, ε = 4": str(tmp_path / "t1.parquet")}, ledger=str(ledger), figure=figure,
                 out_markdown=str(tmp_path / "a.md"), out_rst=str(tmp_path / "a.rst"), links=["t1.html"])
    assert "](figures/forest.png)" in (tmp_path / "a.md").read_text()
    rst = (tmp_path / "a.rst").read_text()
    assert "data:image/png;base64," in rst and max(map(len, rst.splitlines())) < 10_000
    html = publish_string(rst, writer="html", settings_overrides={"report_level": 2}).decode()
    assert "System Message" not in html and "<img alt=\"forest plot of every cell\"" in html
