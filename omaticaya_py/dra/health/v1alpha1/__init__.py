"""Generated from ``api.proto`` (the kubelet's, v1.37.2) by ``scripts/gen-dra-proto``: ``api_pb2``
(messages) and ``api_pb2_grpc`` (stubs, servicers)."""
