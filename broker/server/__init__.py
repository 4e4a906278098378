"""The broker process: configuration, shared context, metrics, CPU and heap settings."""
