"""The report's front page in a real browser: Snakemake's own report of the embedded default (this Snakefile,
config.yaml) opening on the answer page, rendered by Debian's chromium at common widths. The rule graph must not
be drawn over the answer's table, the page must start at its title, and the table must fit the window.

The report is built without running the workflow: every output the DAG names is created empty (the other pages
of the report are not looked at here), except the answer page, which `write_answer` writes from Table 1 files
that `table1` built, with every compared column present (DPSAT's included), the widest page the study can have.
"""

import os
import shutil
import subprocess

import pandas as pd
import pytest

from dpmerge.report.answer import write_answer
from dpmerge.report.tables import table1, write_table
from workflow_runs import ROOT, SNAKEMAKE, snakemake_env

WIDTHS = (1280, 1920)
HEIGHT = 1000
# every method the answer compares with DP, so the page has all its columns
GAINS = {"naive_dp": 0.0, "dp_merging": 3.1, "dp_sam": -1.2, "dp_anchor": 2.4, "dp_sat": 1.7, "dp_sat_anchor": 2.2,
         "nonprivate": 30.5}
OPERATORS = ("ties", "weight_averaging", "task_arithmetic")
# a headless browser (Debian's chromium through playwright): beyond the fast tier (tests/tiers.py)
pytestmark = pytest.mark.system


def chromium() -> str:
    """Debian's chromium; without it the test skips here and fails in CI (.ci/run installs it)."""
    path = next((found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package (pip install -e '.[test]')"
    else:
        missing = None if path else "Debian's chromium (apt-get install chromium)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must render the report in a real browser, but {missing} is not installed")
        pytest.skip(f"no headless browser here: {missing} is not installed")
    return path


def table1_file(folder, backbone: str) -> str:
    rows = [{"model": "individual", "method": "pretrained_head", "task": task, "score": 41.0 + seed,
             "seed": seed, "source_task": task} for seed in range(3) for task in ("a", "b")]
    rows += [{"model": operator, "method": method, "task": task, "score": 50.0 + gain + seed * (1 + index),
              "seed": seed, "source_task": "merged"}
             for seed in range(3) for method, gain in GAINS.items() for index, operator in enumerate(OPERATORS)
             for task in ("a", "b")]
    prefix = folder / f"table1_{backbone}"
    write_table(table1(pd.DataFrame(rows)), prefix, "caption")
    return f"{prefix}.parquet"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    executable = chromium()
    workdir = tmp_path_factory.mktemp("report")
    shutil.copy(ROOT / "config.yaml", workdir / "config.yaml")

    def snakemake(*args):
        made = subprocess.run([*SNAKEMAKE, "--directory", str(workdir), "--cores", "1", "--configfile",
                               str(workdir / "config.yaml"), *args], capture_output=True, text=True,
                              env=snakemake_env())
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        return made.stdout

    outputs = [line.split("\t")[0] for line in snakemake("--summary").splitlines()[1:] if line.strip()]
    assert "results/answer.rst" in outputs  # the Snakefile opens the report on it once it exists
    for name in outputs:
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).touch()
    inputs = workdir / "inputs"
    inputs.mkdir()
    (inputs / "ledger_check.json").write_text('{"verdict": "PASS", "problems": []}')
    write_answer(tables={f"{backbone}, ε = 4": table1_file(inputs, backbone) for backbone in ("effnet", "minilm")},
                 ledger=str(inputs / "ledger_check.json"), out_markdown=str(workdir / "results/answer.md"),
                 out_rst=str(workdir / "results/answer.rst"), links=["tables/table1_effnet_eps4.html"],
                 description=str(ROOT / "workflow/report/workflow.rst"))
    snakemake("--report", str(workdir / "report.html"))
    return executable, workdir / "report.html"


def boxes(page) -> dict:
    """Bounding boxes (viewport pixels, at the page's first scroll position) of the front page's parts."""
    page.wait_for_selector("#rulegraph canvas, #rulegraph svg", state="attached")
    page.wait_for_function("() => { const g = document.querySelector('#rulegraph canvas, #rulegraph svg');"
                           " return g.getBoundingClientRect().height > 0; }")
    return page.evaluate("""() => {
        const box = (selector) => { const found = document.querySelector(selector);
            if (!found) return null; const r = found.getBoundingClientRect();
            return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
        return {graph: box('#rulegraph canvas, #rulegraph svg'), table: box('#app .prose table'),
                title: box('#app .prose h1'), window: {width: window.innerWidth, height: window.innerHeight}};
    }""")


def intersect(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_front_page_shows_the_answer_clear_of_the_rule_graph(report, width):
    from playwright.sync_api import sync_playwright

    executable, html = report
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": HEIGHT})
            page.goto(html.as_uri())
            found = boxes(page)
        finally:
            browser.close()
    graph, table, title = found["graph"], found["table"], found["title"]
    assert table is not None and title is not None, f"the answer page is not the front page: {found}"
    assert graph["right"] > graph["left"] and graph["bottom"] > graph["top"], found
    assert not intersect(graph, table), f"the rule graph is drawn over the answer's table at {width} px: {found}"
    # a flex box centred in a window it overflows cuts its top off out of scrolling reach
    assert title["top"] >= 0, f"the answer's title is cut off above the page at {width} px: {found}"
    assert table["left"] >= 0 and table["right"] <= found["window"]["width"], \
        f"the answer's table does not fit a {width} px window: {found}"
