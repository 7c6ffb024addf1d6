"""The docs' tables of what each identity may do are the rule table's (issue 19): the
generator's output must stand in docs/api-and-kubectl.md between the markers, and what the
tables say is what the authorizer answers."""

from __future__ import annotations

from pathlib import Path

from podnet.api.authorizer import allowed_by_rules, may_access_path
from podnet.api.identity import User
from podnet.api.rolestable import BEGIN, markdown, readme_section

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api-and-kubectl.md"


def test_the_docs_table_is_the_generated_one() -> None:
    assert readme_section(DOC.read_text(encoding="utf-8")) == markdown(), (
        "docs/api-and-kubectl.md's table differs from the rule table: paste the output of "
        "`python -m podnet.api.rolestable` between the rolestable markers"
    )


def test_the_table_stands_in_one_place() -> None:
    """No second, unchecked copy of the table in the README or another docs file."""
    holders = [p.relative_to(ROOT) for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")]]
    holders = [p for p in holders if BEGIN in (ROOT / p).read_text(encoding="utf-8")]
    assert holders == [DOC.relative_to(ROOT)]


def test_the_table_says_what_the_authorizer_answers() -> None:
    """Spot checks: a cell of the table against the authorizer for a user of that role."""
    rows = {line.split(" | ")[0].lstrip("| "): line for line in markdown().splitlines()}
    controllers = User("system:podnet:controllers:c", ("system:podnet:controllers",))
    assert "list watch delete" in rows["pods"].split(" | ")[5]
    assert allowed_by_rules(controllers, "delete", "", "pods", "ns", "p")
    assert not allowed_by_rules(controllers, "create", "", "pods", "ns", None)
    metrics = rows["`/metrics`"].split(" | ")
    assert metrics[2:6] == ["—", "—", "—", "—"]  # node, proxy, router, controllers
    assert not may_access_path(controllers, "get", "/metrics")
    reader = User("prom", ("system:monitoring",))
    assert metrics[6].startswith("get") and may_access_path(reader, "get", "/metrics")
