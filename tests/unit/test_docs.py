"""Docs that are generated must be current."""

from __future__ import annotations

from pathlib import Path

from mdb import reference

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_matches_the_settings_models() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    start, end = "<!-- reference:start -->\n", "<!-- reference:end -->"
    generated = text[text.index(start) + len(start):text.index(end)]
    assert generated == reference.markdown() + "\n", (
        "docs/configuration.md is stale: regenerate its reference section with "
        "`python -m mdb.reference`"
    )
