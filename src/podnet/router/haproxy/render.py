"""A ``RouterTable`` rendered to the files of one generation (pure; no I/O).

A generation is every file HAProxy reads for one table, by path relative to the
generation directory: ``haproxy.cfg``, the maps, the crt-list, ``certs/<ns>:<name>.pem``
(route certificates with their keys) and ``cacerts/<ns>:<name>.pem`` (destination CAs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from podnet.router.haproxy import maps
from podnet.router.haproxy.config import render_config
from podnet.router.haproxy.settings import CONFIG, HAProxySettings
from podnet.router.table import RouterTable

SECRET_MODE = 0o600  # certificates hold private keys
PUBLIC_MODE = 0o644


@dataclass(frozen=True)
class Generation:
    """The files of one rendered table: relative path → text."""

    files: Mapping[str, str]

    def mode(self, relative: str) -> int:
        return SECRET_MODE if relative.startswith("certs/") else PUBLIC_MODE

    @property
    def config(self) -> str:
        return self.files[CONFIG]


def _map_files(table: RouterTable) -> dict[str, str]:
    return {
        maps.HTTP_MAP: maps.http_map(table),
        maps.TLS_MAP: maps.tls_map(table),
        maps.REDIRECT_MAP: maps.redirect_map(table),
        maps.TCP_MAP: maps.tcp_map(table),
        maps.PASSTHROUGH_MAP: maps.passthrough_map(table),
        maps.CRT_LIST: maps.crt_list(table),
    }


def _pem(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def render(table: RouterTable, settings: HAProxySettings, secret: str) -> Generation:
    """Every file of the generation for ``table``; ``secret`` keys the sticky cookies."""
    files = {CONFIG: render_config(table, settings, secret), **_map_files(table)}
    for route in table.routes:
        if maps.has_certificate(route) and route.certificate_pem:
            files[maps.certificate_file(route)] = _pem(route.certificate_pem)
        if maps.has_destination_ca(route) and route.destination_ca_pem:
            files[maps.destination_ca_file(route)] = _pem(route.destination_ca_pem)
    return Generation(MappingProxyType(dict(sorted(files.items()))))
