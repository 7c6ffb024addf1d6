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

from podnet.dataplane.linux import nftables

log = logging.getLogger(__name__)
LIBRARY = "libnftables.so.1"


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

    def close(self) -> None:
        """Free the context (later runs use the nft command)."""
        if self._lib is not None and self._ctx is not None:
            self._lib.nft_ctx_free(self._ctx)
        self._lib = self._ctx = None
