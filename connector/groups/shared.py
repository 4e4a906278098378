"""Shared groups (Nexo model): many consumers split a stream's messages, each one leased.

Two ways to consume, mixable within one group:

* ``client.receive(stream, group, max=10, wait=...)`` (pull) returns Lease
  objects; call ``lease.ack()`` when done or ``lease.nack(delay)`` to have it
  redelivered.
* ``client.receive_batch(stream, group, max=1000, wait=...)`` (pull, batched)
  returns a LeaseBatch: the messages as one Arrow table, settled together
  (``batch.ack()``) or by offset, as offset ranges. The fast way to consume;
  ``client.receive_batches(...)`` iterates over such batches with the next
  one already on its way (prefetch) and acks each when you take the next.
* ``client.subscribe(stream, group, handler, max_in_flight=...)`` (push) opens
  a GroupService.SubscribeBatches stream and calls ``handler(lease)`` in
  worker threads. Credits are the flow control: the broker never has more
  than ``max_in_flight`` unfinished deliveries out to this subscription. A
  handler that returns without settling its lease acks it; one that raises
  nacks it (the broker's backoff applies). The subscription reconnects by
  itself when the broker restarts.

Push delivery is batched both ways, because one gRPC stream message per
delivery and per ack is what limits a Python consumer: the broker sends
everything ready that fits the credits in one DeliveryBatch, and the client
sends acks, nacks and freed credits together, when enough have piled up or
ACK_FLUSH_INTERVAL_S after the first one, whichever comes first.

A lease that is neither acked nor nacked within ``ack_wait`` seconds expires
and the message goes to another member (at-least-once). After
``max_deliver`` attempts it is copied to the dead-letter stream.

The parts live in one module each: ``leases`` (Lease, the group settings,
ack_leases), ``pull`` (receive), ``batch`` (receive_batch, LeaseBatch),
``subscription`` (subscribe, Subscription, reconnecting), ``outbox`` (what a
subscription sends back, coalesced) and ``dispatcher`` (the handler threads).
This module is where users import the
shared-group API from (docs/groups.md), so the names stay here.
"""

from __future__ import annotations

from npstream.groups.batch import LeaseBatch, receive_batch
from npstream.groups.batch_stream import BatchStream, receive_batches
from npstream.groups.leases import Lease, ack_leases
from npstream.groups.pull import receive
from npstream.groups.subscription import Subscription, SubscriptionStats, subscribe

__all__ = ["BatchStream", "Lease", "LeaseBatch", "Subscription", "SubscriptionStats",
           "ack_leases", "receive", "receive_batch", "receive_batches", "subscribe"]
