"""Consumer groups on the client: cursor consumers, shared-group leases, admin."""
