"""A fleet of simulated node agents for the scale benchmarks (issue 9 item 7).

Each simulated agent is one node: its own bearer token, its own keep-alive HTTPS
connection for requests (register the Node, renew the Lease, poll for the HostSubnet,
mark the Node Ready, as ``podnet.agent`` does), and one more HTTPS connection per watched
kind, each a real ``?watch=true`` stream parsed just enough to count events and read
their resourceVersion.

- ``wire``: the raw TLS watch stream (HTTP/1.1 chunked, one JSON event per line).
- ``agent``: one simulated agent.
- ``join``: a node's join (bootstrap token, discovery, CSR), its agent then on mTLS.
- ``worker``: a process running a share of the agents, driven over stdin/stdout.
- ``fleet``: the driver side: node tokens, worker processes, their reports.
- ``cluster``: etcd and a master for a run, and objects written straight to etcd.
"""
