"""The gRPC edge of the broker: status mapping, auth, servicer registration."""
