"""Services as the node's data plane needs them: ``model`` (the backend-neutral desired
state, ``ServiceTable``) and ``compile`` (Services and EndpointSlices -> that state)."""
