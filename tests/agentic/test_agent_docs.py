"""docs/agents.md shows its example whole: the harness and the config on the page are the files the end-to-end test
trains (tests/pipelines/test_agent_gateway_e2e.py), so what a reader copies runs as written; every page the agents
guide names exists, and every framework it lists has an example, a config and a page."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "agents.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC, re.S | re.M)


def test_the_example_on_the_page_is_the_file_that_trains():
    assert blocks("python")[0] == (REPO / "examples" / "agents" / "guess_number_agent.py").read_text()
    assert blocks("yaml")[0] == (REPO / "examples" / "config" / "guess_number_agent_tiny.yaml").read_text()


def test_every_framework_has_an_example_a_config_and_a_page():
    rows = re.findall(r"^\| (.+?) \| `(examples/agents/\w+\.py)`.*?\| \[.*?\]\((\w+\.md)\) \|$", DOC, re.M)
    assert len(rows) == 4, rows
    for _, example, page in rows:
        assert (REPO / example).is_file() and (REPO / "docs" / page).is_file()
        text = (REPO / "docs" / page).read_text()
        config = re.search(r"--config-name (\w+)", text).group(1)
        assert (REPO / "examples" / "config" / f"{config}.yaml").is_file()
        assert (
            example.split("/")[-1].removesuffix(".py") in (REPO / "examples" / "config" / f"{config}.yaml").read_text()
        )
