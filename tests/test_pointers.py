"""Every pointer leads somewhere: the repository paths and the document sections that CONTRIBUTING.md, the
package's docstrings and comments, the rules, pyproject.toml's comments, the Makefile and the bench scripts name
exist, and the architecture doc's rule table lists every rule Snakemake reads."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workflow" / "dpmerge"
ROOMS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_"))
SOURCES = sorted([ROOT / "CONTRIBUTING.md", ROOT / "pyproject.toml", ROOT / "Makefile", ROOT / "Snakefile",
                  *ROOT.glob("bench/*.py"), *ROOT.glob("bench/*.sh"), *PACKAGE.rglob("*.py"),
                  *ROOT.glob("workflow/rules/*.smk")])
# A path into this repository: a file under one of its top folders, or a module of the package (dpmerge/... or a
# room's; a room holds only modules, so its .md names are results or other projects' files)
PATH = re.compile(r"(?<![\w/.<{-])((?:docs|tests|bench|presets|profiles|envs|workflow|\.ci)/[\w./-]*\w\."
                  r"(?:py|md|smk|yaml|sh|rst)|(?:dpmerge|" + "|".join(ROOMS) + r")/[\w./-]*\w\.py)\b")
# A section of a document: README "Title" or docs/x.md, "Title"
SECTION = re.compile(r'(README(?:\.md)?|docs/[\w-]+\.md),? "([^"]+)"')


def _exists(path: str, source: Path) -> bool:
    return any((base / path).exists() for base in (ROOT, ROOT / "workflow", PACKAGE, source.parent))


def _headings(document: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in document.read_text().splitlines() if line.startswith("#")]


@pytest.mark.parametrize("source", SOURCES, ids=[str(s.relative_to(ROOT)) for s in SOURCES])
def test_every_path_and_section_a_file_names_exists(source):
    text = source.read_text()
    missing = [m.group(1) for m in PATH.finditer(text) if not _exists(m.group(1), source)]
    for m in SECTION.finditer(text):
        document = ROOT / (m.group(1) if m.group(1).endswith(".md") else "README.md")
        if not any(m.group(2) in heading for heading in _headings(document)):
            missing.append(f'{m.group(1)} "{m.group(2)}"')
    assert not missing, f"{source.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_architecture_docs_rule_table_lists_every_rule():
    rules = set()
    for path in [ROOT / "Snakefile", *ROOT.glob("workflow/rules/*.smk")]:
        for m in re.finditer(r"^(?:rule (\w+):|use rule \w+ as (\w+))", path.read_text(), re.M):
            rules.add(m.group(1) or m.group(2))
    document = (ROOT / "docs" / "architecture.md").read_text()
    table = document[document.index("| rule (file in `workflow/rules/`)"):]
    named = set(re.findall(r"`(\w+)`", table[:table.index("\n\n")]))
    assert rules and not rules - named, f"rules missing from docs/architecture.md's table: {sorted(rules - named)}"
