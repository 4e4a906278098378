"""The generated gRPC stubs and servicers (npstream_pb2_grpc), apart from ``pb``.

``from npstream.proto import pb_grpc`` imports this module, and with it grpc;
``from npstream.proto import pb`` does not (npstream.proto's docstring).
"""

from npstream.proto.npstream.v1.npstream_pb2_grpc import *  # noqa: F403
