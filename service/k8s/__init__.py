"""Kubernetes: KubeRay manifest builders and their validators.

Nothing here talks to a cluster; ``service.backends.kuberay`` does, with the
objects built here. Importing this package does not import the kubernetes
client.
"""
