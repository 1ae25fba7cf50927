"""Device plugin API v1beta1: ``api_pb2`` (messages) and ``api_pb2_grpc`` (stubs, servicers),
generated from ``api.proto`` by ``scripts/gen-deviceplugin-proto``."""
