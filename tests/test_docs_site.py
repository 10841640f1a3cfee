"""The documentation site's navigation lists every page in docs/ (CI's `mkdocs build --strict` checks links and
API references; this catches a forgotten page without mkdocs installed)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def nav_pages(node) -> list[str]:
    """Every page path in an mkdocs ``nav`` (nested lists of ``{title: page or list}`` or bare paths)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    return [p for item in node for p in nav_pages(item)]


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = REPO / config["docs_dir"]
    pages = nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md"))
    assert sorted(pages) == on_disk
    assert len(pages) == len(set(pages)), "a page is listed twice in mkdocs.yml's nav"
