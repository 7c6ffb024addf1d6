"""The router: OpenShift Routes served by HAProxy.

``table`` is the desired state (admitted routes with their endpoints resolved), built by
the controller from the API's Routes, Services and Endpoints; the HAProxy layer renders
it to a config, maps and certificates and applies it with hitless reloads or runtime API
commands.
"""
