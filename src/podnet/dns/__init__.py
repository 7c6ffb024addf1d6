"""The cluster DNS: each node agent answers its own pods' queries.

- ``records``: what Kubernetes objects stand for in the zone (DNS spec schema 1.1.0);
- ``podrecords``: pod names, answered from the pods' addresses (not stored as records);
- ``counting``: the reference counts both keep;
- ``zone``: the zone index, updated one object at a time;
- ``lookup``: answering a question from the index (NODATA vs NXDOMAIN, CNAME chasing);
- ``wire``: the wire format through dnslib (parsing, encoding, truncation);
- ``cache``: encoded answers keyed by the query's bytes, invalidated by name;
- ``upstreams`` and ``forwarder``: names outside the zone, sent to the node's resolvers;
- ``handler``: from a query's bytes to its answer's;
- ``server``: the UDP and TCP listeners with their bounds;
- ``sync``: the agent's watches feeding the index, and the server's life cycle.
"""
