"""Streams: the registry of streams and the gRPC services that publish and read them."""
