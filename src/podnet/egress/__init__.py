"""Egress: the project egress firewall (EgressNetworkPolicy), as pure desired state."""
