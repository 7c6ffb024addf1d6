"""CNI request validation shared by the shim and the node agent.

Stdlib only and importable on its own (the Python shim loads it as a top-level module
under ``python -I -S``), so it must never import from podnet. The C shim
(``podnet-cni.c``) implements the same checks in the same order with the same codes and
messages; change both together.

Order of checks, first failure wins:

1. ``CNI_COMMAND`` missing or unknown -> 4. ``VERSION`` stops here and always succeeds.
2. Environment for the command (container id, netns, ifname) -> 4.
3. stdin is strict UTF-8 holding one JSON object -> 6.
4. ``cniVersion``/``name``/``type`` are strings -> 7.
5. ``cniVersion`` is supported (absent means 0.1.0, as in libcni) -> 1.
6. The version allows the command (CHECK >= 0.4.0, GC/STATUS >= 1.1.0) -> 1.
7. ``name`` and ``type`` are present and non-empty -> 7.
"""

from __future__ import annotations

import json
import re

# typing costs ~10 ms of start-up under ``python -I -S``; annotations are strings anyway.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
DEFAULT_VERSION = "1.1.0"
# libcni reads a config without cniVersion as 0.1.0, which we do not support.
IMPLICIT_VERSION = "0.1.0"
COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
# The first spec version that defines each command; absent means "all versions".
COMMAND_SINCE = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}

# Well-known error codes of the CNI spec.
ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENVIRONMENT = 4
ERR_IO_FAILURE = 5
ERR_DECODING_FAILURE = 6
ERR_INVALID_NETWORK_CONFIG = 7
ERR_TRY_AGAIN_LATER = 11
ERR_NOT_AVAILABLE = 50
ERR_NOT_AVAILABLE_LIMITED = 51
# podnet's own codes (the spec reserves 100+ for plugins).
ERR_BAD_AGENT_ANSWER = 100
ERR_INTERNAL = 101

# Messages shared with the C shim.
MISSING_ENV = "required environment variables missing"
BAD_CONFIG = "invalid network config"

IFNAME_MAX_BYTES = 15
CONTAINER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Unicode White_Space (what Go's unicode.IsSpace, used by the reference, accepts).
WHITESPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


class CniError(Exception):
    """A CNI error: printed on stdout as ``{cniVersion, code, msg, details}``."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(f"{msg}: {details}" if details else msg)
        self.code = code
        self.msg = msg
        self.details = details
        # Set by validate_request: the version the error should be reported in.
        self.cni_version: str | None = None

    def to_dict(self, cni_version: str | None = None) -> dict[str, Any]:
        """Return the spec's error object, in ``cni_version`` (or the request's)."""
        version = cni_version or self.cni_version or DEFAULT_VERSION
        return {"cniVersion": version, "code": self.code, "msg": self.msg, "details": self.details}

    def to_json(self, cni_version: str | None = None) -> str:
        """Return the error object as JSON text (the shim prints exactly this)."""
        return json.dumps(self.to_dict(cni_version))


class ValidRequest:
    """A request that passed validation: its command, decoded config and version."""

    __slots__ = ("cni_version", "command", "config")

    def __init__(self, command: str, config: dict[str, Any] | None, cni_version: str) -> None:
        self.command = command
        self.config = config
        self.cni_version = cni_version


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_config(data: bytes | str) -> dict[str, Any]:
    """Decode stdin as strict UTF-8 JSON holding one object; raise CniError(6)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        config = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise CniError(ERR_DECODING_FAILURE, "failed to decode network config", str(exc)) from None
    if not isinstance(config, dict):
        raise CniError(
            ERR_DECODING_FAILURE,
            "failed to decode network config",
            "network config is not a JSON object",
        )
    return config


def reply_version(config: Mapping[str, Any] | None) -> str:
    """The version to answer in: the config's cniVersion if it is a non-empty string."""
    version = config.get("cniVersion") if config is not None else None
    return version if isinstance(version, str) and version else DEFAULT_VERSION


def version_answer(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The VERSION command's output."""
    return {"cniVersion": reply_version(config), "supportedVersions": list(SUPPORTED_VERSIONS)}


def check_command(env: Mapping[str, str]) -> str:
    """Return CNI_COMMAND if it is present and known; raise CniError(4)."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CniError(ERR_INVALID_ENVIRONMENT, MISSING_ENV, "CNI_COMMAND")
    if command not in COMMANDS:
        raise CniError(ERR_INVALID_ENVIRONMENT, "unknown CNI_COMMAND", command)
    return command


def _required_env(command: str) -> tuple[str, ...]:
    if command in ("ADD", "CHECK"):
        return ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME")
    if command == "DEL":
        # DEL must succeed without a netns (containerd sends it empty).
        return ("CNI_CONTAINERID", "CNI_IFNAME")
    return ()


def check_ifname(ifname: str) -> None:
    """Apply the spec's interface-name rules; raise CniError(4)."""
    problem = ""
    if len(ifname.encode("utf-8", "surrogateescape")) > IFNAME_MAX_BYTES:
        problem = f"is longer than {IFNAME_MAX_BYTES} bytes"
    elif ifname in (".", ".."):
        problem = "is . or .."
    elif any(ch in "/:" or ch in WHITESPACE for ch in ifname):
        problem = "contains / or : or whitespace"
    if problem:
        raise CniError(ERR_INVALID_ENVIRONMENT, "invalid CNI_IFNAME", f'"{ifname}" {problem}')


def check_env(command: str, env: Mapping[str, str]) -> None:
    """Check the environment variables ``command`` needs; raise CniError(4)."""
    required = _required_env(command)
    missing = [name for name in required if not env.get(name)]
    if missing:
        raise CniError(ERR_INVALID_ENVIRONMENT, MISSING_ENV, ", ".join(missing))
    if "CNI_CONTAINERID" in required:
        container_id = env["CNI_CONTAINERID"]
        if not CONTAINER_ID_RE.fullmatch(container_id):
            raise CniError(
                ERR_INVALID_ENVIRONMENT,
                "invalid CNI_CONTAINERID",
                f'"{container_id}" does not match ^[A-Za-z0-9][A-Za-z0-9_.-]*$',
            )
    if "CNI_IFNAME" in required:
        check_ifname(env["CNI_IFNAME"])


def _check_string_fields(config: Mapping[str, Any]) -> None:
    for key in ("cniVersion", "name", "type"):
        if key in config and not isinstance(config[key], str):
            raise CniError(ERR_INVALID_NETWORK_CONFIG, BAD_CONFIG, f'"{key}" is not a string')


def check_version(command: str, config: Mapping[str, Any]) -> str:
    """Return the config's supported cniVersion, allowed for ``command``; raise CniError(1)."""
    version = config.get("cniVersion") or IMPLICIT_VERSION
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(SUPPORTED_VERSIONS)
        raise CniError(
            ERR_INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            f'config is "{version}", plugin supports {supported}',
        )
    since = COMMAND_SINCE.get(command)
    if since and SUPPORTED_VERSIONS.index(version) < SUPPORTED_VERSIONS.index(since):
        raise CniError(
            ERR_INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            f"config version {version} does not allow {command} (needs {since} or later)",
        )
    return version


def check_config(command: str, config: Mapping[str, Any]) -> str:
    """Check the fields every config needs; return its cniVersion; raise CniError(7|1)."""
    _check_string_fields(config)
    version = check_version(command, config)
    for key in ("name", "type"):
        if not config.get(key):
            raise CniError(ERR_INVALID_NETWORK_CONFIG, BAD_CONFIG, f'missing "{key}"')
    return version


def _decode_lenient(data: bytes | str) -> tuple[dict[str, Any] | None, CniError | None]:
    try:
        return decode_config(data), None
    except CniError as err:
        return None, err


def validate_request(env: Mapping[str, str], data: bytes | str) -> ValidRequest:
    """Run every local check on one invocation (env + stdin), in the documented order.

    Raises CniError with ``cni_version`` set to the version to report it in.
    """
    config, decode_error = _decode_lenient(data)
    version = reply_version(config)
    try:
        command = check_command(env)
        if command == "VERSION":
            return ValidRequest(command, config, version)
        check_env(command, env)
        if decode_error is not None:
            raise decode_error
        assert config is not None
        return ValidRequest(command, config, check_config(command, config))
    except CniError as err:
        err.cni_version = version
        raise
