"""Consumer groups on the client: cursor consumers, shared groups (leases, pull, push), admin."""
