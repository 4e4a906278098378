"""A tiny HTTP endpoint that receives the pipeline's webhook POSTs (for the demo and tests).

    python examples/sensor_pipeline/webhook.py --port 8099 --out /tmp/webhook.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class WebhookReceiver:
    """Collects JSON bodies POSTed to any path; optionally appends them to a JSON-lines file."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, out: Path | None = None) -> None:
        self.received: list[dict] = []
        self.out = out
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    payload = json.loads(body)
                    receiver.received.append(payload)
                    if receiver.out:
                        with receiver.out.open("a") as f:
                            f.write(json.dumps(payload) + "\n")
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/windows"

    def start(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8099)
    p.add_argument("--out", type=Path, default=Path("webhook.jsonl"))
    args = p.parse_args(argv)
    receiver = WebhookReceiver(port=args.port, out=args.out).start()
    print(f"listening on {receiver.url}, writing {args.out}", flush=True)
    try:
        receiver.thread.join()
    except KeyboardInterrupt:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
