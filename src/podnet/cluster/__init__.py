"""The local virtual cluster: the control plane (``controlplane``), the underlay and the
external host (``underlay``), node namespaces with their agents (``nodes``, ``relay``),
pods wired by the real CNI plugin (``pods``, ``echo``), the connectivity matrix
(``matrix``), and what ties them together (``lifecycle``, ``state``)."""
