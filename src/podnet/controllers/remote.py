"""The controllers' object API over HTTPS: the asyncio client, plus namespace finalization.

``podnet controllers`` runs the master's controllers as their own process with a bearer
token; every read, write and watch goes through the API server like any client's.
"""

from __future__ import annotations

from podnet.client.aio import AsyncApiClient
from podnet.model.kinds import NAMESPACE, Kind


class RemoteApi(AsyncApiClient):
    """``ControllerApi`` over HTTPS (``update_status`` comes with the client)."""

    async def finalize_namespace(self, name: str) -> None:
        """PUT ``namespaces/<name>/finalize``: remove a Terminating Namespace for good."""
        namespace = await self.get(NAMESPACE, None, name)
        await self.update(NAMESPACE, namespace, subresource="finalize")

    async def namespaces_in_use(self, kind: Kind) -> set[str]:
        """The namespaces holding an object of ``kind``, from a list of the kind."""
        listing = await self.list(kind)
        return {obj["metadata"]["namespace"] for obj in listing.items}
