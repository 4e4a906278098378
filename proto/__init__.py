"""The npstream wire contract (proto/npstream/v1/npstream.proto) and its generated code.

``from npstream.proto import pb, pb_grpc`` gives the message classes and the
service stubs/servicers. Regenerate with ``python proto/generate.py``.
"""

from npstream.proto.npstream.v1 import npstream_pb2 as pb
from npstream.proto.npstream.v1 import npstream_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
