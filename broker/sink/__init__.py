"""Exactly-once writes: staging, atomic commits with markers, recovery, the stage inbox."""
