"""Kubernetes kubelet device plugin API (generated gRPC code)."""
