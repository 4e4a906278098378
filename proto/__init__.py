"""The npstream wire contract (proto/npstream/v1/npstream.proto) and its generated code.

``from npstream.proto import pb, pb_grpc`` gives the message classes and the
service stubs/servicers. Regenerate with ``python proto/generate.py``.
``pb_grpc`` is a submodule of its own (npstream.proto.pb_grpc), imported only
by who asks for it: the messages need protobuf alone, so a module that uses
only them (the storage engine, the broker's errors) loads no grpc.
"""

from npstream.proto.npstream.v1 import npstream_pb2 as pb

__all__ = ["pb", "pb_grpc"]
