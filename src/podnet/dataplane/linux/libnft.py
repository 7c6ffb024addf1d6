"""nft transactions in-process through libnftables (ctypes), for the service proxy.

At 5,000 services a change is a few lines of nft, but the ``nft`` command pays for its
start and for reading the table's chains and sets back on every run: ~0.15 s a change.
The library, kept open on the backend's node thread, does the same work in about half
of that. The script language and the all-or-nothing transaction are the command's own.
When the library cannot be loaded, ``NftRunner`` runs the ``nft`` command instead.

A context belongs to one thread (the node thread, whose network namespace libnftables'
netlink socket takes when the context is made); it is not shared.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess

from podnet.dataplane.interface import DataPlaneError
from podnet.dataplane.linux import nftables

log = logging.getLogger(__name__)
LIBRARY = "libnftables.so.1"
OUTPUT_TERSE = 1 << 11  # NFT_CTX_OUTPUT_TERSE: sets and maps without their elements
ABSENT = "No such file or directory"  # what nft says when the listed object is not there


class NftRunner:
    """Runs nft scripts as one transaction each; libnftables when it loads."""

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._ctx: int | None = None
        try:
            lib = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            log.info("%s not available (%s): running the nft command", LIBRARY, exc)
            return
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_ctx_output_get_flags.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            return
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        self._lib, self._ctx = lib, ctx

    @property
    def in_process(self) -> bool:
        """Whether scripts run in libnftables (not the nft command)."""
        return self._ctx is not None

    def run(self, script: str) -> str:
        """Run ``script`` as one transaction; its output. Errors as ``nftables.run``'s."""
        if self._lib is None or self._ctx is None:
            return nftables.run(script)
        failed = self._lib.nft_run_cmd_from_buffer(self._ctx, script.encode())
        output = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode()
        if failed:
            error = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode()
            raise nftables.nft_error(f"nft transaction failed: {error.strip()}")
        return output

    def listing(self, command: str, *, terse: bool = False) -> str | None:
        """The output of one list command (nft 1.0.6 fails a batch of several); None
        when what it lists does not exist. ``terse``: sets and maps without elements."""
        try:
            if self._lib is None or self._ctx is None:
                return _listed([nftables.NFT, *(["-t"] if terse else []), "-f", "-"], command)
            flags = self._lib.nft_ctx_output_get_flags(self._ctx)
            self._lib.nft_ctx_output_set_flags(self._ctx, flags | OUTPUT_TERSE if terse else flags)
            try:
                return self.run(command)
            finally:
                self._lib.nft_ctx_output_set_flags(self._ctx, flags)
        except DataPlaneError as err:
            if ABSENT in str(err):
                return None
            raise

    def close(self) -> None:
        """Free the context (later runs use the nft command)."""
        if self._lib is not None and self._ctx is not None:
            self._lib.nft_ctx_free(self._ctx)
        self._lib = self._ctx = None


def _listed(argv: list[str], command: str) -> str:
    """The nft command's output for ``command`` (errors as ``nftables.run``'s)."""
    try:
        done = subprocess.run(
            argv, input=command, capture_output=True, text=True, timeout=nftables.TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DataPlaneError(f"nft failed to run: {err}") from err
    if done.returncode != 0:
        raise nftables.nft_error(f"listing failed: {done.stderr.strip()}")
    return done.stdout
