"""CNI requests for the node agent: the network config, CNI_ARGS, errors, and the answers.

The agent receives the shim's ``POST /cni`` body, turns it into a ``CniRequest`` with
``parse_request`` (which re-runs every check the shims make, with the same codes), and
answers with ``result_answer`` or ``error_answer``. ADD's result and its formats per spec
version are ``podnet.cni.result``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from podnet.cni.fields import get_field, invalid, objects, required
from podnet.cni.result import CniResult, format_result, parse_result

# Names imported "as" themselves are re-exported: the agent imports everything from here.
from podnet.cni.shim import AGENT_PATH as AGENT_PATH
from podnet.cni.shim import DEFAULT_SOCKET as DEFAULT_SOCKET
from podnet.cni.validate import (
    DEFAULT_VERSION,
    CniError,
    check_config,
    decode_config,
    validate_request,
)
from podnet.cni.validate import ERR_BAD_AGENT_ANSWER as ERR_BAD_AGENT_ANSWER
from podnet.cni.validate import ERR_DECODING_FAILURE as ERR_DECODING_FAILURE
from podnet.cni.validate import ERR_INCOMPATIBLE_VERSION as ERR_INCOMPATIBLE_VERSION
from podnet.cni.validate import ERR_INTERNAL as ERR_INTERNAL
from podnet.cni.validate import ERR_INVALID_ENVIRONMENT as ERR_INVALID_ENVIRONMENT
from podnet.cni.validate import ERR_INVALID_NETWORK_CONFIG as ERR_INVALID_NETWORK_CONFIG
from podnet.cni.validate import ERR_IO_FAILURE as ERR_IO_FAILURE
from podnet.cni.validate import ERR_NOT_AVAILABLE as ERR_NOT_AVAILABLE
from podnet.cni.validate import ERR_NOT_AVAILABLE_LIMITED as ERR_NOT_AVAILABLE_LIMITED
from podnet.cni.validate import ERR_TRY_AGAIN_LATER as ERR_TRY_AGAIN_LATER
from podnet.cni.validate import ERR_UNKNOWN_CONTAINER as ERR_UNKNOWN_CONTAINER
from podnet.cni.validate import ERR_UNSUPPORTED_FIELD as ERR_UNSUPPORTED_FIELD
from podnet.cni.validate import SUPPORTED_VERSIONS as SUPPORTED_VERSIONS

MTU_RANGE = range(68, 65536)
VALID_ATTACHMENTS_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


def parse_cni_args(text: str, known: Collection[str] | None = None) -> dict[str, str]:
    """Parse CNI_ARGS ``K=V;K=V``; raise CniError(4) on a malformed pair.

    With ``known`` given, keys outside it are refused unless ``IgnoreUnknown`` is true.
    """
    args: dict[str, str] = {}
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key or "=" in value:
            raise CniError(ERR_INVALID_ENVIRONMENT, "invalid CNI_ARGS", f'bad pair "{item}"')
        args[key] = value
    ignore = args.get("IgnoreUnknown", "").lower() in ("1", "true")
    unknown = sorted(set(args) - set(known) - {"IgnoreUnknown"}) if known is not None else []
    if unknown and not ignore:
        raise CniError(ERR_INVALID_ENVIRONMENT, "unknown CNI_ARGS", ", ".join(unknown))
    return args


@dataclass(frozen=True)
class Attachment:
    """One entry of GC's ``cni.dev/valid-attachments``."""

    container_id: str
    ifname: str


@dataclass(frozen=True)
class NetworkConfig:
    """A validated network config, as the runtime sent it for this plugin."""

    name: str
    cni_version: str
    type: str
    prev_result: CniResult | None = None
    runtime_config: dict[str, Any] = field(default_factory=dict)
    ipam: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    socket_path: str | None = None
    mtu: int | None = None
    namespace: str | None = None
    valid_attachments: tuple[Attachment, ...] | None = None  # GC only
    raw: dict[str, Any] = field(default_factory=dict)


def _parse_attachments(config: Mapping[str, Any]) -> tuple[Attachment, ...] | None:
    """GC's list of still-valid attachments, or None when no key is present.

    libcni sends both keys with the same value (the second is a spec typo kept alive).
    A key that is present must hold a list: ``null`` or any other type is refused (7),
    never read as "no valid attachments", which would detach every pod of the node.
    Two keys with different lists are refused too: which one is meant is unknown.
    """
    what = "network config"
    present = [k for k in VALID_ATTACHMENTS_KEYS if k in config]
    for key in present:
        if not isinstance(config[key], list):
            raise invalid(what, f'"{key}" must be a list of attachments')
    lists = [tuple(_attachment(item) for item in objects(config, k, what)) for k in present]
    if len(set(lists)) > 1:
        raise invalid(what, f"{' and '.join(present)} differ")
    return lists[0] if lists else None


def _attachment(item: Mapping[str, Any]) -> Attachment:
    what = "network config"
    return Attachment(required(item, "containerID", what), required(item, "ifname", what))


def _parse_prev_result(config: Mapping[str, Any]) -> CniResult | None:
    prev = get_field(config, "prevResult", dict, "network config")
    return parse_result(prev) if prev is not None else None


def _config_from(config: dict[str, Any], cni_version: str) -> NetworkConfig:
    what = "network config"
    mtu = get_field(config, "mtu", int, what)
    if mtu is not None and mtu not in MTU_RANGE:
        raise invalid(what, f'"mtu" must be from {MTU_RANGE.start} to {MTU_RANGE.stop - 1}')
    return NetworkConfig(
        name=config["name"],
        cni_version=cni_version,
        type=config["type"],
        prev_result=_parse_prev_result(config),
        runtime_config=get_field(config, "runtimeConfig", dict, what) or {},
        ipam=get_field(config, "ipam", dict, what) or {},
        args=get_field(config, "args", dict, what) or {},
        socket_path=get_field(config, "socketPath", str, what) or None,
        mtu=mtu,
        namespace=get_field(config, "namespace", str, what) or None,
        valid_attachments=_parse_attachments(config),
        raw=config,
    )


def parse_network_config(text: str | bytes, command: str = "ADD") -> NetworkConfig:
    """Parse and check the stdin config of a ``command``; raise CniError(6|7|1)."""
    config = decode_config(text)
    return _config_from(config, check_config(command, config))


@dataclass(frozen=True)
class CniRequest:
    """One CNI invocation as the agent receives it from a shim, fully validated."""

    command: str
    container_id: str
    netns: str
    ifname: str
    args: dict[str, str]
    path: tuple[str, ...]
    config: NetworkConfig | None  # None for VERSION only
    env: dict[str, str]

    @property
    def cni_version(self) -> str:
        """The version to answer in."""
        return self.config.cni_version if self.config else DEFAULT_VERSION


BAD_REQUEST = "invalid request from shim"


def _decode_shim_body(body: bytes | str) -> tuple[dict[str, str], str]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise CniError(ERR_DECODING_FAILURE, BAD_REQUEST, str(exc)) from None
    env = obj.get("env") if isinstance(obj, dict) else None
    config = obj.get("config") if isinstance(obj, dict) else None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise CniError(ERR_DECODING_FAILURE, BAD_REQUEST, '"env" must map to strings')
    if not isinstance(config, str):
        raise CniError(ERR_DECODING_FAILURE, BAD_REQUEST, '"config" must be a string')
    return env, config


def parse_request(body: bytes | str) -> CniRequest:
    """Decode the shim's ``{"env", "config"}`` body and validate it like the shims do.

    Raises CniError (with ``cni_version`` set to the version to answer in).
    """
    env, text = _decode_shim_body(body)
    checked = validate_request(env, text)
    try:
        config = None
        if checked.command != "VERSION" and checked.config is not None:
            config = _config_from(checked.config, checked.cni_version)
        args = parse_cni_args(env.get("CNI_ARGS", ""))
    except CniError as err:
        err.cni_version = checked.cni_version
        raise
    path = tuple(p for p in env.get("CNI_PATH", "").split(":") if p)
    return CniRequest(
        command=checked.command,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        ifname=env.get("CNI_IFNAME", ""),
        args=args,
        path=path,
        config=config,
        env=dict(env),
    )


def http_status_for(code: int) -> int:
    """The HTTP status the agent uses for a CNI error code (the shims only need non-2xx)."""
    if code in (ERR_TRY_AGAIN_LATER, ERR_NOT_AVAILABLE, ERR_NOT_AVAILABLE_LIMITED):
        return 503
    if 1 <= code <= 7:
        return 400
    return 500


def error_answer(err: CniError, cni_version: str | None = None) -> tuple[int, bytes]:
    """The agent's HTTP answer for an error: (status, CNI error JSON body)."""
    return http_status_for(err.code), err.to_json(cni_version).encode()


def result_answer(result: CniResult | None, cni_version: str) -> tuple[int, bytes]:
    """The agent's HTTP answer on success: ADD's result, or an empty body for the rest."""
    if result is None:
        return 200, b""
    return 200, json.dumps(format_result(result, cni_version)).encode()
