"""The README starts with the point and stays short; it and the documents under docs/ link only to what exists.

A document moved or renamed, a heading reworded or a test module renamed leaves a link pointing nowhere;
these checks name each such link with its file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
TEST_MODULE = re.compile(r"\btests/test_\w+\.py\b")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of a markdown file outside fenced code blocks, with code spans removed, numbered from 1."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, CODE_SPAN.sub("", line)))
    return out


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, code marks and punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for _, line in prose_lines(path) if re.match(r"#{1,6} ", line)}


def relative_links(path: Path) -> list[tuple[int, str]]:
    return [
        (n, target)
        for n, line in prose_lines(path)
        for target in LINK.findall(line)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto: ... are not files of this repository
    ]


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_picture_is_near_the_top_of_the_readme() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:40]
    assert any(re.search(r"!\[[^\]]+\]\(docs/demo\.png\)", line) for line in head)
    assert (ROOT / "docs" / "demo.png").is_file()


def test_every_relative_link_points_to_a_file_that_exists_and_a_heading_it_has() -> None:
    broken = []
    for doc in DOCUMENTS:
        for n, target in relative_links(doc):
            where, _, anchor = target.partition("#")
            path = (doc.parent / where).resolve() if where else doc
            name = f"{doc.relative_to(ROOT)}:{n}: {target}"
            if not path.exists():
                broken.append(f"{name}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{name}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_every_document_under_docs_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in relative_links(README)}
    unlinked = [p.name for p in DOCUMENTS[1:] if p.resolve() not in linked]
    assert not unlinked, f"not linked from README.md: {unlinked}"


def test_every_test_module_the_documents_name_exists() -> None:
    missing = [
        f"{doc.relative_to(ROOT)}:{n}: {m}"
        for doc in DOCUMENTS
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        for m in TEST_MODULE.findall(line)
        if not (ROOT / m).is_file()
    ]
    assert not missing, "\n".join(missing)


def test_ci_runs_the_readmes_test_command() -> None:
    """`.ci/run` sets up as the README's second command does (with the lint extra too), then runs its pytest."""
    command = next(
        line for line in README.read_text(encoding="utf-8").splitlines() if "pip install -q -e '.[test]'" in line
    )
    setup, _, run = command.rpartition(" && ")
    ci = [
        line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line.startswith((".", "("))
    ]
    assert setup.replace("'.[test]'", "'.[test,lint]'") == ci[0]
    assert run == ci[-1] == ".venv/bin/pytest -q"
