"""The Kafka listener: Kafka's wire protocol over npstream's streams (docs/kafka.md)."""
