"""systemd unit files as systemd reads them, for the tests of the units in
src/podnet/deploy/systemd (linked as examples/systemd): settings by section with
continuation lines joined, and ``ExecStart`` as the argv systemd would run, its
``EnvironmentFile`` taken from the example of the same name beside the unit
(``master.env`` for ``/etc/podnet/master.env``) and ``%H`` filled in. A problem (a
variable the example lacks, a specifier left) fails the assertion."""

from __future__ import annotations

import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from podnet.deploy import parse_env

VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass
class Unit:
    path: Path
    sections: dict[str, list[tuple[str, str]]]

    def values(self, section: str, key: str) -> list[str]:
        return [v for k, v in self.sections.get(section, []) if k == key]

    def value(self, section: str, key: str) -> str:
        found = self.values(section, key)
        assert len(found) == 1, f"{self.path.name}: [{section}] {key}= {found}"
        return found[0]


def load_unit(path: Path) -> Unit:
    """A unit file's settings, continuation lines joined as systemd joins them."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("["):
            current = line.strip("[]")
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections[current].append((key.strip(), value.strip()))
    return Unit(path, sections)


def env_file(unit: Unit) -> dict[str, str]:
    """The unit's EnvironmentFile, from the example of the same name beside the units."""
    env: dict[str, str] = {}
    for name in unit.values("Service", "EnvironmentFile"):
        example = unit.path.parent / Path(name.lstrip("-")).name
        assert example.exists(), f"{unit.path.name}: no example {example.name} for {name}"
        env |= parse_env(example.read_text())
    return env


def exec_start(
    unit: Unit, env: dict[str, str] | None = None, hostname: str | None = None
) -> list[str]:
    """ExecStart as systemd runs it: specifiers, then ``${VAR}`` (one word) and ``$VAR``
    (split into words), from ``env`` (default: the EnvironmentFile examples beside the
    unit) and ``hostname`` (default: this machine's) for ``%H``."""
    env = env_file(unit) if env is None else env
    line = unit.value("Service", "ExecStart").lstrip("-@:+!")
    line = line.replace("%H", hostname or socket.gethostname()).replace("%%", "%")
    assert "%" not in line, f"{unit.path.name}: a specifier this test does not fill: {line}"

    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in env, f"{unit.path.name}: ${name} is not in its EnvironmentFile example"
        return env[name]

    argv: list[str] = []
    for word in shlex.split(line):
        alone = re.fullmatch(r"\$(\w+)", word)
        if alone:  # an unbraced $VAR alone is split into words, as systemd does
            argv += variable(alone).split()
        else:
            argv.append(VARIABLE.sub(variable, word))
    return argv
