"""The Python SDK: the connection, ``Client``, its result types, publishing and local reads."""
