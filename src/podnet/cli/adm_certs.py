"""``podnet adm certs upload``: seal this master's CA keys for a further master to join
with (kubeadm's ``init phase upload-certs --upload-certs``).

Run on a master (``adm init`` made it, or a master that joined): it reads the API's CA
pair from the master's state dir, etcd's two CA pairs from ``/etc/podnet/etcd-pki`` and
the cluster's settings from ``/etc/podnet/master.env``, seals them
(``podnet.api.controlplanecerts``) into the master's etcd with the etcd settings the
master saved (``<state dir>/etcd.json``), and prints the key, once. The record expires
after ``--ttl``; a new upload replaces it (and the old key opens nothing).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from podnet import deploy
from podnet.cli.adm import adm
from podnet.cli.main import CliError

MASTER_STATE_DIR = Path("/var/lib/podnet/master")
ETCD_PKI = "etcd-pki"
# bundle name -> (which directory, file name)
SOURCES = {
    "ca.crt": ("pki", "ca.crt"),
    "ca.key": ("pki", "ca.key"),
    "etcd-ca.crt": ("etcd", "ca.crt"),
    "etcd-ca.key": ("etcd", "ca.key"),
    "etcd-peer-ca.crt": ("etcd", "peer-ca.crt"),
    "etcd-peer-ca.key": ("etcd", "peer-ca.key"),
}


def read_bundle(state_dir: Path, config_dir: Path) -> dict[str, str]:
    """What a further master needs from this one; CliError names a missing file."""
    from podnet.api.controlplanecerts import SETTINGS

    dirs = {"pki": state_dir / "pki", "etcd": config_dir / ETCD_PKI}
    bundle: dict[str, str] = {}
    for name, (where, file) in SOURCES.items():
        path = dirs[where] / file
        try:
            bundle[name] = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {path}: is this host a master? ({exc})") from exc
    env_path = config_dir / "master.env"
    try:
        env = deploy.parse_env(env_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read {env_path}: is this host a master? ({exc})") from exc
    missing = [key for key in SETTINGS if not env.get(key)]
    if missing:
        raise CliError(f"{env_path} lacks {', '.join(missing)}")
    bundle.update({key: env[key] for key in SETTINGS})
    return bundle


@adm.group("certs")
def certs() -> None:
    """The control plane's keys, for further masters."""


@certs.command("upload")
@click.option("--ttl", default="2h", show_default=True, help="how long the upload lives: 30m, 2h")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=MASTER_STATE_DIR,
    show_default=True,
    help="the master's state dir (its pki/ and etcd.json)",
)
def upload(ttl: str, state_dir: Path) -> None:
    """Seal the CA keys into etcd and print the key `adm join master` opens them with."""
    from podnet.api.controlplanecerts import new_key, record_key, seal
    from podnet.api.tokenrecords import RecordError, parse_ttl
    from podnet.api.tokenstore import NoStoreSettings, StoreSettings, run
    from podnet.store.base import Put, StoreError

    try:
        lifetime = parse_ttl(ttl)
    except RecordError as exc:
        raise CliError(str(exc)) from exc
    if lifetime > dt.timedelta(hours=24):
        raise CliError("--ttl is at most 24h: the upload holds the cluster's CA keys")
    bundle = read_bundle(state_dir, deploy.CONFIG_DIR)
    try:
        settings = StoreSettings.require(state_dir)
    except NoStoreSettings as exc:
        raise CliError(str(exc)) from exc
    key = new_key()
    value = seal(bundle, key, dt.datetime.now(dt.UTC), lifetime)
    try:
        run(settings, lambda store: store.commit([], [Put(record_key(settings.prefix), value)]))
    except StoreError as exc:
        raise CliError(f"etcd at {settings.endpoints}: {exc}") from exc
    click.echo(f"control-plane certificates sealed in etcd for {ttl}; certificate key:")
    click.echo(key)
