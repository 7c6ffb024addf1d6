"""podman 4.3 as a real CNI client, confined to a temporary folder and a network namespace.

The recipe is the one ``docs/runtimes.md`` gives, run from the page: podman on its CNI
backend, runc, cgroupfs, file events, raised ulimits, a private storage root; and a local
busybox image imported from a rootfs tarball (no registry). Every podman command runs
inside a network namespace the test made, so the bridges, rules and sysctls it creates
stay there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from podnet import netns
from podnet.testing import docsteps

BUSYBOX = Path("/bin/busybox")
IMAGE = "localhost/podnet-bb"
RECIPE = docsteps.DOCS / "runtimes.md"


@dataclass
class PodmanEnv:
    """podman's configuration, storage and image under ``root``."""

    root: Path
    cni_bin_dir: Path  # podnet's; the reference plugins' come from /usr/lib/cni
    cni_conf_dir: Path

    @property
    def containers_conf(self) -> Path:
        return self.root / "containers.conf"

    @property
    def storage_conf(self) -> Path:
        return self.root / "storage.conf"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CONTAINERS_CONF": str(self.containers_conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
            "XDG_RUNTIME_DIR": str(self.root / "xdg"),
            "TMPDIR": str(self.root / "tmp"),
        }

    def variables(self) -> dict[str, str]:
        """The settings ``docs/runtimes.md`` has the reader set (``NODE_NETNS`` is given
        per command)."""
        return {
            "PODMAN_ROOT": str(self.root),
            "CNI_BIN_DIR": str(self.cni_bin_dir),
            "CNI_CONF_DIR": str(self.cni_conf_dir),
            "IMAGE": IMAGE,
        }

    def write_config(self) -> None:
        """podman's configuration, written by the documented step as it stands."""
        docsteps.run_step(RECIPE, "podman-config", self.variables())

    def build_image(self) -> None:
        """Import a busybox rootfs as ``IMAGE`` (no registry involved)."""
        tarball = rootfs_tarball(self.root)
        self.podman(None, "import", "--change", 'CMD ["/bin/sh"]', str(tarball), IMAGE, timeout=120)

    def podman(
        self, namespace: str | None, *args: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run podman (inside ``namespace`` when given)."""
        argv = ["podman", *args]
        if namespace:
            argv = netns.command(namespace, argv)
        result = subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed: {result.stderr.strip()}")
        return result


def rootfs_tarball(directory: Path) -> Path:
    """A busybox root file system as a tarball in ``directory``, for ``podman import``."""
    rootfs = directory / "rootfs"
    (rootfs / "bin").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "tmp").mkdir(exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        link = rootfs / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    tarball = directory / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(rootfs, arcname=".")
    return tarball
