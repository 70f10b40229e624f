"""README and docs/ cannot go stale silently: every relative link names a file that exists (in the repository, or
beside it for ../shared), every #anchor a heading of its page, and the README stays a page (what, two commands, one
example per command, links)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(line) for line in page.read_text().splitlines() if line.startswith("#")}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if "shared" in Path(path).parts:  # the contract and the data live beside the repository
                continue
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no {dest})")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
    assert not broken, "\n".join(broken)


def test_readme_is_a_page_and_names_every_command():
    from click.testing import CliRunner

    from slimjax.cli import main

    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 120
    commands = re.findall(r"^  (\w+)\s", CliRunner().invoke(main, ["--help"]).output, re.M)
    assert commands and all(f"| `{c}` |" in text for c in commands), commands
