"""The hand-made hosts of the real-host guide's test (``podnet.testing.hosts``): each
has its own /etc, /var/lib, /opt and /run/podnet, its own host name and address, reaches
the others on the underlay, and leaves nothing behind."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from podnet import netns
from podnet.testing.hosts import Hosts

pytestmark = [pytest.mark.root]


def test_hosts_are_apart_yet_on_one_underlay_and_leave_nothing(tmp_path: Path) -> None:
    prefix = f"ph{uuid.uuid4().hex[:6]}"
    marker = f"guide-{uuid.uuid4().hex[:8]}"
    with Hosts(prefix, tmp_path) as lab:
        a, b = lab.add("alpha", 21), lab.add("beta", 22)
        a.sh(f"mkdir -p /etc/podnet /var/lib/podnet /opt/podnet && echo {marker} > /etc/podnet/x")
        a.sh(f"echo {marker} > /var/lib/podnet/y && echo {marker} > /opt/podnet/z")
        a.sh(f"echo {marker} > /run/podnet/w")
        assert a.sh("cat /etc/podnet/x /var/lib/podnet/y /opt/podnet/z /run/podnet/w").stdout == (
            f"{marker}\n" * 4
        )
        for path in ("/etc/podnet/x", "/var/lib/podnet/y", "/opt/podnet/z", "/run/podnet/w"):
            assert not Path(path).exists()  # the machine's directories never change
            assert b.sh(f"test ! -e {path} && echo apart").stdout == "apart\n"
        assert a.sh("hostname").stdout.strip() == "alpha"
        assert b.sh("hostname").stdout.strip() == "beta"
        assert b.sh("cat /etc/hostname >/dev/null; test -r /etc/resolv.conf && echo etc").stdout
        route = a.sh("ip -4 route show default").stdout
        assert "via 10.0.0.1 dev eth0" in route, route
        assert a.sh("ping -c 1 -W 2 10.0.0.22 >/dev/null && echo reached").stdout == "reached\n"
        log = a.start("sleeper", ["sleep", "300"])
        pid = a.daemons["sleeper"].pid
        assert Path(f"/proc/{pid}").exists()
        names = (a.netns, b.netns, lab.underlay)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert log.exists()
    for name in names:
        assert not netns.exists(name)
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(tmp_path) not in mounts  # the namespace files are unbound
    shown = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout
    assert shown.strip() not in ("alpha", "beta")
