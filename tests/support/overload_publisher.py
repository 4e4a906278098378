"""One flooding process of tests/broker/test_overload.py (run as a script, not collected).

``python overload_publisher.py ADDRESS STREAM NAME THREADS REQUESTS ROWS ROW_BYTES OUT
RETRY_DEADLINE``: THREADS threads each publish REQUESTS tables of ROWS rows of ROW_BYTES
bytes (one unary Publish each, every row with a unique id) and write the ids the broker
acknowledged, and the errors, to OUT as JSON. With RETRY_DEADLINE 0 the SDK does not
retry an overloaded broker: the thread sees ``Overloaded`` itself, records it and sends
the same request again after the broker's ``retry_after``, as an application would.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pyarrow as pa

from npstream import Client, Overloaded


def main(argv: list[str]) -> None:
    address, stream, name, threads, requests, rows, row_bytes, out, deadline = argv
    acked: list[str] = []
    overloaded: list[dict[str, object]] = []
    errors: list[str] = []
    lock = threading.Lock()

    # One client (one connection) shared by the threads: the calls multiplex on it.
    client = Client(address, retry_deadline=float(deadline), timeout=120)

    def work(thread: int) -> None:
        if True:
            for request in range(int(requests)):
                ids = [f"{name}-{thread}-{request}-{row}" for row in range(int(rows))]
                table = pa.table({
                    "value": [f"{i}|".encode().ljust(int(row_bytes), b"v") for i in ids],
                    "id": ids})
                while True:
                    try:
                        client.publish_batch(stream, table)
                    except Overloaded as exc:
                        with lock:
                            overloaded.append({"message": str(exc),
                                               "retry_after": exc.retry_after})
                        time.sleep(max(exc.retry_after, 0.05))
                        continue
                    except Exception as exc:
                        with lock:
                            errors.append(f"{type(exc).__name__}: {exc}")
                    else:
                        with lock:
                            acked.extend(ids)
                    break

    workers = [threading.Thread(target=work, args=(t,)) for t in range(int(threads))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    client.close()
    with open(out, "w") as handle:
        json.dump({"acked": acked, "overloaded": overloaded, "errors": errors}, handle)


if __name__ == "__main__":
    main(sys.argv[1:])
