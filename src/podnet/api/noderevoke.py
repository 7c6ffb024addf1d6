"""Revoking a node's credentials (``podnet adm node remove``), on every master at once.

A node holds a bearer token (a record of user ``system:node:<node>`` in the masters' etcd,
``podnet.api.tokenrecords``) or a client certificate from a CSR. Revoking deletes every
token record of the node's user (each under its revision, so a token issued at the same
moment is not lost unseen) and revokes every certificate of the user issued until now
(``podnet.api.certrevocation``). Each master stops both within 5 s.
"""

from __future__ import annotations

from podnet.api.certrevocation import revoke_certificates
from podnet.api.identity import node_user
from podnet.api.tokenissue import StoredToken, list_tokens
from podnet.api.tokenrecords import token_key
from podnet.api.tokenstore import StoreSettings, run
from podnet.store.base import Delete, ModRevisionIs, Store

__all__ = ["node_tokens", "revoke_node_credentials"]


async def _tokens_of(store: Store, prefix: str, node: str) -> list[StoredToken]:
    user = node_user(node)
    return [t for t in await list_tokens(store, prefix) if t.record.user == user]


def node_tokens(settings: StoreSettings, node: str) -> int:
    """How many token records node ``node`` has."""
    return len(run(settings, lambda store: _tokens_of(store, settings.prefix, node)))


def revoke_node_credentials(settings: StoreSettings, node: str) -> int:
    """Delete node ``node``'s token records and revoke its certificates issued until
    now; how many token records were deleted."""
    if not node:
        raise ValueError("node name must not be empty")

    async def revoke(store: Store) -> int:
        deleted = 0
        for stored in await _tokens_of(store, settings.prefix, node):
            key = token_key(settings.prefix, stored.digest)
            if await store.commit([ModRevisionIs(key, stored.revision)], [Delete(key)]):
                deleted += 1
        await revoke_certificates(store, settings.prefix, node_user(node))
        return deleted

    return run(settings, revoke)
