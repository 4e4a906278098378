"""The on-disk frame format: what the broker writes and a same-host reader checks."""
