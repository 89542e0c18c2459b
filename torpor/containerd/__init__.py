"""A Python gRPC client for containerd's v1 API (the services and messages torpor uses).

The .proto files in `api/` are torpor's own, written with containerd's package names and field
numbers; the generated `*_pb2.py` modules are committed and regenerated with `make protos`.
"""
