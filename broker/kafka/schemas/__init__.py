"""Kafka's JSON message schemas (Apache-2.0, README.md), read by the Kafka codec."""
