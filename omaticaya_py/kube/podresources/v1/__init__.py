"""PodResources API v1: ``api_pb2`` (messages) and ``api_pb2_grpc`` (the ``PodResourcesLister``
stub), generated from ``api.proto`` by ``scripts/gen-podresources-proto``."""
