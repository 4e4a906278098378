"""A cluster of brokers: membership, placement of new streams, routing to owners."""
