"""The config reference: docs/config.md is what ``titans-lm config --explain --format=md`` prints
for the repository's configs, and every field of every config is described."""

from pathlib import Path

from titans_lm.config.fields import FIELDS
from titans_lm.config.reference import COMMAND, explain, reference_configs, rows

REPO = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current():
    configs = reference_configs(REPO / "configs")
    want = explain(configs, "md")
    have = (REPO / "docs" / "config.md").read_text()
    assert have == want, f"docs/config.md is stale: run `{COMMAND}` at the repository root"
    # Every described field occurs in some config (no description of a field that is gone), each
    # row has a type, a default and a description.
    table = rows(configs)
    assert [r.name for r in table] == list(FIELDS)
    assert all(r.type and r.default and r.doc for r in table)
    text = explain(configs, "text")
    assert all(f"  {name} (" in text for name in FIELDS)
