"""The documentation against the repository: README.md and docs/*.md may only link to files that exist, name
repository paths that exist, and quote job counts that a dry run of the quoted command reproduces.

Job counts are quoted in one format only: a Markdown table whose header has a "command" and a "jobs" column. The
command cell is `make <target>` (the Makefile's own snakemake line for that target is dry-run) or a
`snakemake ...` command; the jobs cell is the number `snakemake -n` plans for it in an empty results folder.
Paths are named in backticks either from the repository root (`presets/full.yaml`), from workflow/
(`dpmerge/merge/registry.py`) or from the package (`merge/registry.py`); outputs (results*/, standins/), the
installed environment (.venv/) and anything with a placeholder ({backbone}, <name>, *) are not repository paths."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workflow_runs import ROOT, snakemake_env

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROSE = [*DOCS, ROOT / "CHANGELOG.md"]
README_MAX_LINES = 250
LEAD_MARKER = "<!-- LEAD:"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG_SRC = re.compile(r"<img\b[^>]*\bsrc\s*=\s*[\"']([^\"']+)[\"']", re.I)
PATH_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*/?$")
# A bare file name (no folder) counts as a repository path only for kinds that outputs never have
CODE_SUFFIXES = {".py", ".smk", ".yaml", ".yml", ".toml", ".cff", ".sh"}
NOT_REPOSITORY = ("results", "standins", ".venv", ".snakemake/")
SKIPPED_FOLDERS = {".git", ".venv", ".snakemake", "__pycache__", ".pytest_cache", ".hypothesis", "standins", "data"}
ISSUE_REFERENCE = re.compile(r"\bissues?\s+#?\d+\b|(?<![\w&/])#\d+\b", re.I)


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def without_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def relative_links(text: str) -> list[str]:
    """Link targets of Markdown links and <img src> outside code, without external URLs and in-page anchors."""
    prose = INLINE_CODE.sub("", without_code_blocks(text))
    targets = MD_LINK.findall(prose) + IMG_SRC.findall(prose)
    return [t for t in targets if not re.match(r"^(?:[a-z][a-z0-9+.\-]*:|#)", t, re.I)]


def test_relative_links_resolve():
    broken = []
    for doc in DOCS:
        for target in relative_links(doc.read_text()):
            path = target.split("#", 1)[0]
            if path and not (doc.parent / path).exists():
                broken.append(f"{doc_id(doc)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_link_finder_sees_links_and_images():
    # the checker above is only as good as its extraction; an unresolvable link must be found to be reported
    text = 'See [a](docs/x.md#part), ![b](figures/y.png "t"), <img src="z.png">, [u](https://e.org) and [c](#c).\n'
    assert relative_links(text) == ["docs/x.md#part", "figures/y.png", "z.png"]


def repository_files_by_name() -> dict[str, Path]:
    found = {}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_FOLDERS and not d.startswith("results")]
        found.update({name: Path(folder) / name for name in files if name not in found})
    return found


FILES_BY_NAME = repository_files_by_name()


def path_candidates(token: str) -> list[Path] | None:
    """Where a backticked token would live if it is a repository path; None when it is not one."""
    if not PATH_TOKEN.match(token) or token.startswith(NOT_REPOSITORY) or token in (".", ".."):
        return None
    top = token.split("/", 1)[0]
    package = ROOT / "workflow" / "dpmerge"
    if "/" not in token.rstrip("/"):
        if Path(token).suffix in CODE_SUFFIXES or (ROOT / token).exists():
            # a bare file name: it must be the name of some file of the repository
            return [ROOT / token, FILES_BY_NAME.get(token, ROOT / token)]
        return None
    if (ROOT / top).exists():
        return [ROOT / token]
    if top == "dpmerge":
        return [ROOT / "workflow" / token]
    if (package / top).is_dir():
        return [package / token]
    return None


def named_paths(text: str) -> list[str]:
    """Every whitespace-separated token of every inline code span and of every fenced code block."""
    spans = INLINE_CODE.findall(without_code_blocks(text))
    spans += ["\n".join(block.group(0).splitlines()[1:-1]) for block in FENCE.finditer(text)]
    return [token.lstrip("(").rstrip(".,;:)") for span in spans for token in span.split()]


def test_named_repository_paths_exist():
    missing = []
    for doc in DOCS:
        for token in named_paths(doc.read_text()):
            candidates = path_candidates(token)
            if candidates is not None and not any(p.exists() for p in candidates):
                missing.append(f"{doc_id(doc)}: `{token}`")
    assert not missing, "repository paths named in the docs that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_path_finder_tells_paths_from_outputs_and_prose():
    assert path_candidates("presets/full.yaml") == [ROOT / "presets/full.yaml"]
    assert path_candidates("dpmerge/merge/registry.py") == [ROOT / "workflow/dpmerge/merge/registry.py"]
    assert path_candidates("merge/registry.py") == [ROOT / "workflow/dpmerge/merge/registry.py"]
    assert not any(p.exists() for p in path_candidates("presets/no_such_preset.yaml"))  # would be reported
    assert not any(p.exists() for p in path_candidates("no_such_module.py"))
    assert any(p.exists() for p in path_candidates("registry.py"))
    assert ROOT / ".snakemake-workflow-catalog.yml" in path_candidates(".snakemake-workflow-catalog.yml")
    assert "envs/dpmerge.yaml" in named_paths("```\nenvs/dpmerge.yaml   the conda env\n```\n")
    for not_a_path in ("results/answer.md", "results_full/tables/audit.md", "1/N", "σ/√2",
                       "results/tables/table1_{backbone}_eps4.md", "profiles/<yours>", "--configfile"):
        assert path_candidates(not_a_path) is None, not_a_path


def job_count_rows() -> list[tuple[str, str, str]]:
    """(document, command, jobs cell) for every row of every table with a "command" and a "jobs" column."""
    rows = []
    for doc in DOCS:
        lines = without_code_blocks(doc.read_text()).splitlines()
        header = None
        for line in lines:
            if not line.startswith("|"):
                header = None
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = [c.lower() for c in cells]
                continue
            if set(cells) <= {""} or all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            if "command" in header and "jobs" in header:
                command = INLINE_CODE.findall(cells[header.index("command")])
                rows.append((doc_id(doc), command[0] if command else "", cells[header.index("jobs")]))
    return rows


def snakemake_arguments(command: str) -> list[str]:
    """The snakemake arguments a quoted command runs: for `make X`, the Makefile's first snakemake line of X
    that builds (not the report)."""
    if command.startswith("make "):
        plan = subprocess.run(["make", "-n", command.split()[1]], cwd=ROOT, capture_output=True, text=True)
        assert plan.returncode == 0, f"`{command}`: {plan.stderr.strip()}"
        lines = [line for line in plan.stdout.splitlines()
                 if "snakemake" in line and "--configfile" in line and "--report" not in line]
        assert lines, f"`{command}` runs no snakemake with a --configfile:\n{plan.stdout}"
        command = lines[0]
    words = shlex.split(command)
    starts = [i for i, word in enumerate(words) if word.endswith("snakemake")]
    assert starts, f"`{command}` is neither `make <target>` nor a snakemake command"
    arguments = words[starts[0] + 1:]
    return arguments if "--snakefile" in arguments else ["--snakefile", str(ROOT / "Snakefile"), *arguments]


ROWS = job_count_rows()


def test_job_counts_are_quoted_in_the_table_format():
    # the studies' page quotes its counts in the format the next test checks; an empty parse would check nothing
    assert any(doc == "docs/studies.md" for doc, _, _ in ROWS), "docs/studies.md has no command/jobs table"


@pytest.mark.parametrize("doc,command,jobs", ROWS, ids=[f"{d}:{c}" for d, c, _ in ROWS])
def test_quoted_job_count_equals_dry_run(doc, command, jobs, tmp_path):
    assert command, f"{doc}: a row of a command/jobs table has no command in backticks"
    assert re.fullmatch(r"\d{1,3}(,\d{3})*|\d+", jobs), f"{doc}, `{command}`: jobs cell {jobs!r} is not a number"
    # an empty working directory, so that results already on disk do not shrink the plan
    result = subprocess.run([sys.executable, "-m", "snakemake", *snakemake_arguments(command), "-n", "--quiet",
                             "rules", "--directory", str(tmp_path)],
                            cwd=ROOT, env=snakemake_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"`{command}` does not dry-run:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    totals = re.findall(r"^total\s+(\d+)\s*$", result.stdout, flags=re.M)
    assert totals, f"`{command}`: no job total in the dry run's output:\n{result.stdout[-3000:]}"
    assert int(totals[-1]) == int(jobs.replace(",", "")), (
        f"{doc}: `{command}` quotes {jobs} jobs, its dry run plans {totals[-1]}")


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"


def test_no_issue_references_or_outside_files():
    found = []
    for doc in PROSE:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if ISSUE_REFERENCE.search(line) or "shared/" in line:
                found.append(f"{doc_id(doc)}:{number}: {line.strip()}")
    assert not found, "issue references or files outside the repository:\n" + "\n".join(found)


def test_issue_pattern_catches_references_only():
    for reference in ("see issue 18", "Issues 6 and 7", "fixed in #42", "(#7)"):
        assert ISSUE_REFERENCE.search(reference), reference
    for not_one in ("Tables 1-8", "arXiv 2608.26655", "[demo](#demo-make-demo)", "&#8722;", "C#", "seeds 1 and 2"):
        assert not ISSUE_REFERENCE.search(not_one), not_one


def test_no_placeholder_left_for_the_lead():
    # the demo's numbers are measured last and written in place of these markers; none may land
    left = [f"{doc_id(doc)}:{n}" for doc in PROSE for n, line in enumerate(doc.read_text().splitlines(), 1)
            if LEAD_MARKER in line]
    assert not left, "measurements still to be filled in at:\n" + "\n".join(left)


def test_citation_describes_this_version():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    version = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M)[1]
    assert citation["version"] == version
    assert citation["license"] in (ROOT / "LICENSE").read_text().splitlines()[0]
    assert "2608.26655" in yaml.safe_dump(citation["preferred-citation"])
