"""Kubernetes I/O: the one client the operator's reads and writes go through."""
