"""Client side of exactly-once writes: staging data and committing batches."""
