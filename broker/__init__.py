"""The npstream broker: storage engine, stream registry, groups, sink and gRPC services.

Run it with ``python -m npstream.broker`` (see docs/broker.md). Nothing is
imported here so that submodules (storage, groups) load without the server.
"""
