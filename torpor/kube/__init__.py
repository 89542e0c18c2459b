"""Kubernetes through its API server: the client (`kubectl`, the user's kubeconfig) and the pod a
migration makes. torpor's formats for kubelet's archives and images live in torpor.image."""
