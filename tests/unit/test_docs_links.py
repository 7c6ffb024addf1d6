"""The README and docs/ name only what the repository holds (issue 20): every relative link
resolves to a file (and heading) of the repository, every repository path they name in
backticks or in a code block exists, no file of the repository refers to files outside it,
the README links every docs file and stays short."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_README_LINES = 260
PREFIXES = ("src/", "tests/", "examples/", "bench/", "scripts/", "docs/")
FENCED = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")
SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
# built from pieces, so that this file does not name what it looks for
OUTSIDE = re.compile(
    "|".join(
        [
            r"\b(?:" + "|".join(["REFERENCE", "DESIGN", "STYLE"]) + r")\.md\b",
            re.escape("/".join(["..", "shared"])),
            re.escape("/".join(["", "work", "shared"])),
        ]
    ),
    re.IGNORECASE,
)
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return FENCED.sub("", text)


def slug(heading: str, seen: Counter[str]) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    base = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    count = seen[base]
    seen[base] += 1
    return base if count == 0 else f"{base}-{count}"


def anchors(text: str) -> set[str]:
    seen: Counter[str] = Counter()
    return {
        slug(match.group(1), seen)
        for line in prose(text).splitlines()
        if (match := HEADING.match(line))
    }


def broken_links(source: Path, text: str, root: Path = ROOT) -> list[str]:
    """Relative links of ``text`` (a file at ``source``) to nothing in the repository."""
    broken = []
    for target in LINK.findall(prose(text)):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        linked = (source.parent / path).resolve() if path else source
        if not linked.is_relative_to(root.resolve()) or not linked.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no such heading")
    return broken


def named_paths(text: str) -> set[str]:
    """Repository paths named in backticks, or as words of a code block."""
    paragraphs = re.split(r"\n\s*\n", prose(text))  # a code span never crosses one
    names = [span.strip() for para in paragraphs for span in CODE.findall(para)]
    names += [word for block in FENCED.findall(text) for word in block.split()]
    paths = set()
    for name in names:
        name = name.split("::")[0].rstrip(".,;:)")
        if name.startswith(PREFIXES) and not re.search(r"[\s<>*{}$]", name):
            paths.add(name)
    return paths


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    return sorted(path for path in named_paths(text) if not (root / path).exists())


def repository_files() -> list[Path]:
    """The files git knows of (tracked, and new ones not ignored); every file without git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if not SKIPPED_DIRS & set(p.parts)]
    return [path for path in files if path.is_file() and "egg-info" not in str(path)]


def outside_references(text: str) -> list[str]:
    return [match.group(0) for match in OUTSIDE.finditer(text)]


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in markdown_files()
        for problem in broken_links(path, path.read_text(encoding="utf-8"))
    ]
    assert broken == []


def test_every_named_repository_path_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in markdown_files()
        for name in missing_paths(path.read_text(encoding="utf-8"))
    ]
    assert missing == []


def test_no_file_refers_to_files_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {reference}"
        for path in repository_files()
        for reference in outside_references(path.read_bytes().decode("utf-8", "replace"))
    ]
    assert found == []


def test_the_readme_is_short_and_links_every_docs_file() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < MAX_README_LINES
    linked = {target.partition("#")[0] for target in LINK.findall(prose(text))}
    docs = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert docs and docs <= linked, f"not linked from README.md: {sorted(docs - linked)}"


def test_the_checks_above_would_see_a_breach(tmp_path: Path) -> None:
    """Each check finds what it looks for (a rule that cannot fail is no rule)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "here.py").write_text("")
    doc = tmp_path / "docs" / "a.md"
    doc.write_text("# A title\n\n## `podnet trace`\n")
    text = (
        "[ok](a.md#podnet-trace) [gone](b.md) [bad anchor](a.md#nope) [out](../../etc/passwd)\n"
        "[web](https://example.com) `src/here.py` `tests/x.py::test_y` `<state>/src/x`\n"
        "1. a step\n\n   ```sh\n   scripts/missing.sh --flag\n   ```\n\nthen `src/gone.py`\n"
    )
    assert broken_links(doc, text, tmp_path) == [
        "b.md: no such file in the repository",
        "a.md#nope: no such heading",
        "../../etc/passwd: no such file in the repository",
    ]
    assert missing_paths(text, tmp_path) == ["scripts/missing.sh", "src/gone.py", "tests/x.py"]
    design, shared = "DESIGN" + ".md", "/".join(["..", "shared"])
    assert outside_references(f"see {design} and {shared}/x") == [design, shared]
    assert outside_references("docs/design.py, a REFERENCES.md file") == []
