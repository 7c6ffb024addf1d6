"""Helpers for tests and benchmarks: real etcd and master processes on loopback."""
