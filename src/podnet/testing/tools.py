"""The outside tools podnet's tests need, and one way to require them.

A test of a required tool never skips when the tool is missing: it fails and says what to
install (``scripts/setup.sh`` installs all of them). The same goes for root: the kernel
tests need it, and a run that cannot give it deselects them openly with ``-m "not root"``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

import pytest

SETUP = "install it with scripts/setup.sh"
KUBECTL_MIN = (1, 28)  # Debian's own kubernetes-client (1.20) is too old for podnet's API


@dataclass(frozen=True)
class Tool:
    """An executable the tests run, where it is found, and where it comes from."""

    name: str
    source: str  # the Debian package, or where else it comes from
    path: str | None = None  # an absolute path when the tests use that one, else $PATH
    version_argv: tuple[str, ...] = ("--version",)


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("etcd", "Debian package etcd-server", "/usr/bin/etcd"),
        Tool("etcdctl", "Debian package etcd-client", "/usr/bin/etcdctl", ("version",)),
        Tool("nft", "Debian package nftables", version_argv=("--version",)),
        Tool("ip", "Debian package iproute2", version_argv=("-V",)),
        Tool("ping", "Debian package iputils-ping", version_argv=("-V",)),
        Tool("iperf3", "Debian package iperf3"),
        Tool("gcc", "Debian packages gcc and libc6-dev (the C CNI shim)"),
        Tool("podman", "Debian package podman"),
        Tool("ovs-vswitchd", "Debian package openvswitch-switch"),
        Tool("ovs-ofctl", "Debian package openvswitch-common"),
        Tool("runc", "Debian package runc"),
        Tool("busybox", "Debian package busybox-static", "/bin/busybox", ()),
        Tool("haproxy", "Debian package haproxy (2.6)", "/usr/sbin/haproxy", ("-v",)),
        Tool("openssl", "Debian package openssl", version_argv=("version",)),
        Tool("curl", "Debian package curl"),
        Tool("unshare", "Debian package util-linux", version_argv=("--version",)),
        Tool("systemd-analyze", "Debian package systemd", "/usr/bin/systemd-analyze", ()),
        Tool(
            "host-local",
            "Debian package containernetworking-plugins",
            "/usr/lib/cni/host-local",
            (),
        ),
        Tool(
            "kubectl",
            "this machine kind's image; Debian's kubernetes-client 1.20 is too old",
            "/usr/bin/kubectl",
            ("version", "--client"),
        ),
    )
}


def find(name: str) -> str | None:
    """The executable ``name`` stands for, or None when it is not installed."""
    tool = TOOLS[name]
    if tool.path is not None:
        return tool.path if os.access(tool.path, os.X_OK) else None
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def version(name: str) -> tuple[int, ...] | None:
    """The version ``name`` reports (its first dotted number), or None."""
    path, tool = find(name), TOOLS[name]
    if path is None or not tool.version_argv:
        return None
    try:
        done = subprocess.run(
            [path, *tool.version_argv], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.stdout + done.stderr)
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def problem(name: str, min_version: tuple[int, ...] | None = None) -> str | None:
    """Why ``name`` cannot serve the tests (missing, or older than ``min_version``)."""
    tool = TOOLS[name]
    where = tool.path or name
    if find(name) is None:
        return f"{name} is required and missing ({where}; from {tool.source}): {SETUP}"
    if min_version is None:
        return None
    have = version(name)
    wanted = ".".join(map(str, min_version))
    if have is None:
        return f"{name} ({where}) does not report its version; the tests need >= {wanted}"
    if have < min_version:
        got = ".".join(map(str, have))
        return f"{name} ({where}) is {got}; the tests need >= {wanted} (from {tool.source})"
    return None


def require(name: str, min_version: tuple[int, ...] | None = None) -> str:
    """The path of ``name``; the calling test FAILS (never skips) when it is unusable."""
    if reason := problem(name, min_version):
        pytest.fail(reason, pytrace=False)
    path = find(name)
    assert path is not None
    return path


def require_root() -> None:
    """Fail the calling test unless it runs as root (network namespaces, nftables)."""
    if os.geteuid() != 0:
        pytest.fail(
            "this test needs root (network namespaces, nftables): run the suite as root, "
            'or deselect the kernel tests openly with -m "not root"',
            pytrace=False,
        )
