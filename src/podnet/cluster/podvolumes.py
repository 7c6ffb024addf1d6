"""Volumes of a local-cluster pod: host directories bound into its sandbox, as a
Kubernetes ``hostPath`` volume is, checked so that none undoes what the sandbox keeps
from the pod.

A volume ``(source, target)`` shows the host directory ``source`` (and every mount below
it) at ``target`` in the pod, read-write, with the host's owners and modes. It is refused
when it would show the pod what the sandbox hides (podnet's state: the source holds or
lies in a hidden directory), share what each pod has private (the source is or holds
``/tmp``, ``/var/tmp``, ``/dev/shm`` or ``/run/lock``), or be covered by the sandbox's
own mounts, or cover them (the target lies in or holds a hidden or private directory,
``/proc``, a directory others cannot enter above the Python the pod runs, which gets a
tmpfs of its own; or it holds ``/etc``, with the pod's resolv.conf, or that Python).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from podnet.cluster.podcni import PodError
from podnet.cluster.sandbox import closed_ancestor, hidden_paths, interpreter_paths
from podnet.cluster.sandboxmounts import PRIVATE_TMPFS

__all__ = ["Volume", "check_volumes", "parse_volume"]

Volume = tuple[Path, Path]  # (host directory, where the pod sees it)
PROC = Path("/proc")
ETC = Path("/etc")


def parse_volume(text: str) -> Volume:
    """``HOST_DIR:POD_DIR`` as a volume (not yet checked); PodError if malformed."""
    source, sep, target = text.partition(":")
    if not sep or not source or not target or ":" in target:
        raise PodError(f"volume {text!r}: expected HOST_DIR:POD_DIR")
    return Path(source), Path(target)


def _held(path: Path, places: Iterable[Path]) -> Path | None:
    """The first of ``places`` that ``path`` is or holds (None if none)."""
    return next((place for place in places if place.is_relative_to(path)), None)


def _overlaps(path: Path, places: Iterable[Path]) -> Path | None:
    """The first of ``places`` that ``path`` is, lies in or holds (None if none)."""
    return next((p for p in places if path.is_relative_to(p) or p.is_relative_to(path)), None)


def _existing_dir(path: Path, what: str) -> Path:
    """``path`` resolved, if it is an absolute path to a directory; else PodError."""
    if not path.is_absolute() or ":" in str(path):
        raise PodError(f"volume {what} {path}: not an absolute path without ':'")
    resolved = Path(os.path.realpath(path))
    if not resolved.is_dir():
        raise PodError(f"volume {what} {path}: not an existing directory")
    if ":" in str(resolved):
        raise PodError(f"volume {what} {path}: resolves to {resolved}, which holds ':'")
    return resolved


def _private() -> list[Path]:
    return [Path(os.path.realpath(p)) for p in PRIVATE_TMPFS]


def _check_source(source: Path, hidden: Sequence[Path]) -> Path:
    resolved = _existing_dir(source, "directory")
    if (place := _held(resolved, _private())) is not None:
        raise PodError(f"volume {source}: would share the host's {place}, private to each pod")
    if (place := _overlaps(resolved, hidden)) is not None:
        raise PodError(f"volume {source}: would show the pod {place}, which its sandbox hides")
    return resolved


def _check_target(target: Path, hidden: Sequence[Path]) -> Path:
    resolved = _existing_dir(target, "target")
    exposed = interpreter_paths()  # a closed directory above them gets a tmpfs of its own
    closed = [c for p in exposed if (c := closed_ancestor(p)) is not None]
    covered = (*_private(), PROC, *hidden, *closed)
    if (place := _overlaps(resolved, covered)) is not None:
        raise PodError(f"volume target {target}: overlaps {place}, which the pod sandbox mounts")
    kept = (ETC, *exposed)
    if (place := _held(resolved, kept)) is not None:
        raise PodError(f"volume target {target}: would cover {place}, which the pod needs")
    return resolved


def check_volumes(volumes: Sequence[Volume], state_dir: Path) -> tuple[Volume, ...]:
    """``volumes`` with both paths resolved, each checked as the module docstring says
    (``state_dir``: the cluster's, hidden from its pods), no two targets one inside the
    other; else PodError naming the volume and why."""
    hidden = hidden_paths([state_dir])
    checked: list[Volume] = []
    for source, target in volumes:
        volume = (_check_source(source, hidden), _check_target(target, hidden))
        if (other := _overlaps(volume[1], [t for _, t in checked])) is not None:
            raise PodError(f"volume target {target}: overlaps another volume's, {other}")
        checked.append(volume)
    return tuple(checked)
