"""What each served Kafka API does with npstream's streams.

A stream is a topic of one partition, 0; Kafka offsets are npstream offsets.
Produce goes through the stream's log ``append`` (dedup, typed checks,
budgets and the storage's group commit, as a gRPC publish) and Fetch through
its ``read``, waiting on the log's append listeners as the gRPC long poll.
Errors of one topic are answered in that topic's error code; only a request
that does not decode closes the connection (listener.py).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from npstream.broker.errors import (
    BrokerError,
    InvalidArgumentError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    StreamNotFoundError,
)
from npstream.broker.kafka.errors import CodecError
from npstream.broker.kafka.errors import ErrorCode as Err
from npstream.broker.kafka.protocol import (
    API_VERSIONS_KEY,
    SERVED,
    RequestFrame,
    decode_body,
    encode_response,
)
from npstream.broker.kafka.records import (
    UnsupportedCompressionError,
    decode_batches,
    encode_batch,
)
from npstream.broker.kafka.tuning import FETCH_WAIT_SLICE_S
from npstream.broker.server.context import BrokerContext
from npstream.broker.storage import AckMode, StreamLog
from npstream.broker.streams.names import check_stream_name
from npstream.proto.schema import normalize_publish_table

__all__ = ["KafkaHandlers", "topic_id"]

log = logging.getLogger("npstream.broker.kafka")

NODE_ID = 0
CLUSTER_ID = "npstream"
_TOPIC_NAMESPACE = uuid.UUID("6b1f4c0e-3a52-5d0e-9a51-6e7073747265")
_EARLIEST, _LATEST = -2, -1


def topic_id(name: str, created_ms: int) -> uuid.UUID:
    """A stream's topic id: stable for its life, new when a stream of that name is remade."""
    return uuid.uuid5(_TOPIC_NAMESPACE, f"{name}\0{created_ms}")


class KafkaHandlers:
    """Answers decoded requests; one instance per listener, shared by its connections."""

    def __init__(self, ctx: BrokerContext, advertised: str) -> None:
        self._ctx = ctx
        self._registry = ctx.registry
        self._metrics = ctx.metrics
        self.stopping = ctx.stopping
        host, _, port = advertised.rpartition(":")
        self._broker = {"NodeId": NODE_ID, "Host": host.strip("[]"), "Port": int(port),
                        "Rack": None}
        self._ids: dict[uuid.UUID, str] = {}
        self._ids_lock = threading.Lock()
        self._auto_create = ctx.config.kafka.kafka_auto_create_topics
        self._calls: dict[int, Callable[[int, dict[str, Any]], dict[str, Any] | None]] = {
            0: self._produce, 1: self._fetch, 2: self._list_offsets, 3: self._metadata,
            API_VERSIONS_KEY: self._api_versions,
        }

    def handle(self, request: RequestFrame) -> bytes | None:
        """The response frame, or None when none is due (acks=0); CodecError to close."""
        api = SERVED.get(request.api_key)
        if api is None:
            raise CodecError(f"API key {request.api_key} is not served")
        version = request.api_version
        if not api.min_version <= version <= api.max_version:
            if api.key == API_VERSIONS_KEY:  # KIP-511: answer in v0 with the versions
                return encode_response(api, 0, request.correlation_id,
                                       self._versions(Err.UNSUPPORTED_VERSION))
            raise CodecError(f"{api.name} v{version} is not served "
                             f"(v{api.min_version}-{api.max_version})")
        body = self._calls[api.key](version, decode_body(api, request))
        if body is None:
            return None
        return encode_response(api, version, request.correlation_id, body)

    # ------------------------------------------------------------ ApiVersions

    @staticmethod
    def _versions(error: int) -> dict[str, Any]:
        return {"ErrorCode": error, "ThrottleTimeMs": 0, "ApiKeys": [
            {"ApiKey": a.key, "MinVersion": a.min_version, "MaxVersion": a.max_version}
            for a in SERVED.values()]}

    def _api_versions(self, _version: int, _body: dict[str, Any]) -> dict[str, Any]:
        return self._versions(Err.NONE)

    # ------------------------------------------------------------ topics

    def _log(self, name: str, create: bool) -> StreamLog:
        """The stream's log; StreamNotFoundError, or InvalidArgumentError for a bad name."""
        name = check_stream_name(name)
        stream_log = self._registry.get(name, create_if_missing=create and self._auto_create)
        return stream_log

    def _topic_id(self, name: str) -> uuid.UUID:
        created_ms = self._registry.describe(name).created_ms
        tid = topic_id(name, created_ms)
        with self._ids_lock:
            self._ids[tid] = name
        return tid

    def _name_of(self, tid: uuid.UUID) -> str | None:
        with self._ids_lock:
            name = self._ids.get(tid)
        if name is None:  # a client that learned the id before a restart
            for candidate in self._registry.matching():
                if self._topic_id(candidate) == tid:
                    return candidate
        return name

    def _metadata(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        requested = body["Topics"]
        allow = body["AllowAutoTopicCreation"] if version >= 4 else True
        if requested is None or (version == 0 and not requested):
            names = self._registry.matching()
            topics = [self._topic_metadata(n, create=False) for n in names]
        else:
            topics = []
            for entry in requested:
                name = entry["Name"]
                if name is None:
                    name = self._name_of(entry["TopicId"]) or ""
                topics.append(self._topic_metadata(name, create=allow))
        return {"ThrottleTimeMs": 0, "Brokers": [self._broker], "ClusterId": CLUSTER_ID,
                "ControllerId": NODE_ID, "Topics": topics,
                "ClusterAuthorizedOperations": -2147483648}

    def _topic_metadata(self, name: str, create: bool) -> dict[str, Any]:
        topic: dict[str, Any] = {"Name": name, "IsInternal": False, "Partitions": [],
                                 "TopicAuthorizedOperations": -2147483648}
        try:
            self._log(name, create)
        except InvalidArgumentError as exc:
            return {**topic, "ErrorCode": Err.INVALID_TOPIC_EXCEPTION, "ErrorMessage": str(exc)}
        except StreamNotFoundError:
            return {**topic, "ErrorCode": Err.UNKNOWN_TOPIC_OR_PARTITION}
        return {**topic, "ErrorCode": Err.NONE, "TopicId": self._topic_id(name), "Partitions": [
            {"ErrorCode": Err.NONE, "PartitionIndex": 0, "LeaderId": NODE_ID, "LeaderEpoch": 0,
             "ReplicaNodes": [NODE_ID], "IsrNodes": [NODE_ID], "OfflineReplicas": []}]}

    # ------------------------------------------------------------ Produce

    def _produce(self, version: int, body: dict[str, Any]) -> dict[str, Any] | None:
        responses = []
        for topic in body["TopicData"]:
            name = topic["Name"]
            partitions = [self._produce_partition(name, p, body)
                          for p in topic["PartitionData"]]
            responses.append({"Name": name, "PartitionResponses": partitions})
        if body["Acks"] == 0:
            return None
        return {"Responses": responses, "ThrottleTimeMs": 0}

    def _produce_partition(self, name: str, data: dict[str, Any],
                           body: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"Index": data["Index"], "BaseOffset": -1,
                                 "LogAppendTimeMs": -1, "LogStartOffset": -1,
                                 "RecordErrors": [], "ErrorMessage": None}

        def error(code: int, message: str | None = None) -> dict[str, Any]:
            log.info("kafka produce to '%s' refused: %s (error %d)", name, message, code)
            return {**reply, "ErrorCode": code, "ErrorMessage": message}

        if body["TransactionalId"] is not None:
            return error(Err.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                         "transactions are not served by npstream's Kafka listener")
        if data["Index"] != 0:
            return error(Err.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' has only partition 0")
        # The records' wire bytes count in the publish memory budget while they are decoded
        # and written, as a PublishStream request's: past it this connection waits (TCP
        # holds the producer back) instead of the broker buffering without bound.
        held = len(data["Records"] or b"")
        self._ctx.publish_budget.acquire(held, f"a Kafka produce to '{name}'", wait_s=None,
                                         should_stop=self.stopping.is_set)
        try:
            return self._append(name, data, body, reply, error)
        finally:
            self._ctx.publish_budget.release(held)

    def _append(self, name: str, data: dict[str, Any], body: dict[str, Any],
                reply: dict[str, Any],
                error: Callable[..., dict[str, Any]]) -> dict[str, Any]:
        try:
            batches = list(decode_batches(data["Records"] or b""))
        except UnsupportedCompressionError as exc:
            return error(Err.UNSUPPORTED_COMPRESSION_TYPE, str(exc))
        except CodecError as exc:
            return error(Err.CORRUPT_MESSAGE, str(exc))
        if any(b.transactional for b in batches):
            return error(Err.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                         "transactional batches are not served")
        try:
            stream_log = self._log(name, create=True)
            if not batches:
                return {**reply, "ErrorCode": Err.NONE, "BaseOffset": stream_log.end_offset}
            rows = normalize_publish_table(pa.concat_tables([b.rows for b in batches]))
            ack = AckMode.WRITE if body["Acks"] == 1 else AckMode.FSYNC
            result = stream_log.append(rows, ack)
        except InvalidArgumentError as exc:
            code = Err.MESSAGE_TOO_LARGE if isinstance(exc, MessageTooLargeError) \
                else Err.INVALID_RECORD
            if "stream name" in str(exc):
                code = Err.INVALID_TOPIC_EXCEPTION
            return error(code, str(exc))
        except StreamNotFoundError:
            return error(Err.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist")
        except BrokerError as exc:  # a full disk, a stream being moved, the broker stopping
            return error(Err.UNKNOWN_SERVER_ERROR, str(exc))
        self._metrics.publish_requests.inc()
        self._metrics.published_messages.inc(result.stored_count)
        self._metrics.published_bytes.inc(rows.nbytes)
        self._metrics.count_in(name, result.stored_count, rows.nbytes)
        log.debug("kafka produce: %d message(s) to '%s' at offset %d", result.stored_count,
                  name, result.first_offset)
        return {**reply, "ErrorCode": Err.NONE, "BaseOffset": result.first_offset,
                "LogAppendTimeMs": result.timestamp_ms,
                "LogStartOffset": stream_log.start_offset}

    # ------------------------------------------------------------ Fetch

    def _fetch(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + max(body["MaxWaitMs"], 0) / 1000
        while True:
            responses, nbytes, logs = self._fetch_once(version, body)
            left = deadline - time.monotonic()
            if nbytes >= max(body["MinBytes"], 1) or left <= 0 or self.stopping.is_set():
                return {"ThrottleTimeMs": 0, "ErrorCode": Err.NONE, "SessionId": 0,
                        "Responses": responses}
            self._wait_for_append(logs, min(left, FETCH_WAIT_SLICE_S))

    def _wait_for_append(self, logs: list[StreamLog], wait_s: float) -> None:
        """Until one of the logs is appended to, the wait ends or the broker stops."""
        with self._ctx.parked_polls.park() as woken:
            if woken is None:
                return
            for stream_log in logs:
                stream_log.add_append_listener(woken.set)
            try:
                woken.wait(wait_s)
            finally:
                for stream_log in logs:
                    stream_log.remove_append_listener(woken.set)

    def _fetch_once(self, version: int, body: dict[str, Any],
                    ) -> tuple[list[dict[str, Any]], int, list[StreamLog]]:
        budget = body["MaxBytes"] if version >= 3 else 1 << 30
        total = 0
        logs: list[StreamLog] = []
        responses = []
        for topic in body["Topics"]:
            name = topic["Topic"] if version < 13 else self._name_of(topic["TopicId"])
            partitions = []
            for part in topic["Partitions"]:
                reply, records, stream_log = self._fetch_partition(
                    name, part, min(part["PartitionMaxBytes"], budget) if total else
                    part["PartitionMaxBytes"], unknown_id=version >= 13)
                partitions.append(reply)
                if stream_log is not None:
                    logs.append(stream_log)
                total += len(records)
                budget -= len(records)
            responses.append({"Topic": name or "", "TopicId": topic["TopicId"],
                              "Partitions": partitions})
        return responses, total, logs

    def _fetch_partition(self, name: str | None, part: dict[str, Any], max_bytes: int,
                         unknown_id: bool) -> tuple[dict[str, Any], bytes, StreamLog | None]:
        reply: dict[str, Any] = {"PartitionIndex": part["Partition"], "HighWatermark": -1,
                                 "LastStableOffset": -1, "LogStartOffset": -1,
                                 "AbortedTransactions": None, "PreferredReadReplica": -1,
                                 "Records": b""}
        missing = Err.UNKNOWN_TOPIC_ID if unknown_id else Err.UNKNOWN_TOPIC_OR_PARTITION
        if name is None or part["Partition"] != 0:
            return {**reply, "ErrorCode": missing}, b"", None
        try:
            stream_log = self._log(name, create=False)
        except (StreamNotFoundError, InvalidArgumentError):
            return {**reply, "ErrorCode": missing}, b"", None
        offset = part["FetchOffset"]
        reply.update(HighWatermark=stream_log.end_offset, LastStableOffset=stream_log.end_offset,
                     LogStartOffset=stream_log.start_offset)
        if offset == stream_log.end_offset or max_bytes <= 0:
            return {**reply, "ErrorCode": Err.NONE}, b"", stream_log
        try:
            result = stream_log.read(offset, max_bytes=max_bytes)
            records = b""
            if result.count:
                table = stream_log.read_table(offset, result.next_offset)
                records = encode_batch(table)
        except OffsetOutOfRangeError:
            return {**reply, "ErrorCode": Err.OFFSET_OUT_OF_RANGE}, b"", stream_log
        self._metrics.fetch_requests.inc()
        self._metrics.fetched_messages.inc(result.count)
        self._metrics.fetched_bytes.inc(len(records))
        self._metrics.count_out(name, result.count, len(records))
        return {**reply, "ErrorCode": Err.NONE, "Records": records}, records, stream_log

    # ------------------------------------------------------------ ListOffsets

    def _list_offsets(self, version: int, body: dict[str, Any]) -> dict[str, Any]:
        topics = []
        for topic in body["Topics"]:
            partitions = [self._list_offset(topic["Name"], p) for p in topic["Partitions"]]
            topics.append({"Name": topic["Name"], "Partitions": partitions})
        return {"ThrottleTimeMs": 0, "Topics": topics}

    def _list_offset(self, name: str, part: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"PartitionIndex": part["PartitionIndex"], "Timestamp": -1,
                                 "Offset": -1, "LeaderEpoch": 0}
        if part["PartitionIndex"] != 0:
            return {**reply, "ErrorCode": Err.UNKNOWN_TOPIC_OR_PARTITION}
        try:
            stream_log = self._log(name, create=False)
        except (StreamNotFoundError, InvalidArgumentError):
            return {**reply, "ErrorCode": Err.UNKNOWN_TOPIC_OR_PARTITION}
        wanted = part["Timestamp"]
        if wanted == _EARLIEST:
            return {**reply, "ErrorCode": Err.NONE, "Offset": stream_log.start_offset}
        if wanted == _LATEST or wanted < 0:  # -3 (max timestamp) answered as latest
            return {**reply, "ErrorCode": Err.NONE, "Offset": stream_log.end_offset}
        offset = stream_log.offset_for_timestamp(wanted)
        if offset >= stream_log.end_offset:
            return {**reply, "ErrorCode": Err.NONE}
        return {**reply, "ErrorCode": Err.NONE, "Offset": offset,
                "Timestamp": stream_log.timestamp_at(offset)}
