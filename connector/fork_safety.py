"""Keep gRPC's fork handlers off, so that starting Spark beside a busy client is safe.

PySpark starts its JVM with ``subprocess.Popen(preexec_fn=...)``: a real
``fork()`` that runs gRPC's fork handlers. Since grpcio 1.80 the handler in
the child restarts gRPC's poller, Popen then closes its epoll descriptor
before ``exec``, and the child dies ("epoll_wait error: Bad file descriptor")
whenever a channel was busy in another thread: ``[JAVA_GATEWAY_EXITED] Java
gateway process exited before sending its port number`` now and then
(grpc/grpc#43055; measured here: 22 and 11 of 200 such forks crashed beside a
publishing client, none of 200 with the handlers off). Any other
``fork()``+``exec`` with ``preexec_fn`` is hit the same way.

gRPC reads ``GRPC_ENABLE_FORK_SUPPORT`` once, when ``grpc`` is first imported,
so the default is set here, by the package's ``__init__`` before any module
of the package imports grpc: every way in (``import npstream``, the CLI,
``pyspark_npstream`` that Spark loads, ``npstream.broker``) runs it first. A
value the user set wins: ``GRPC_ENABLE_FORK_SUPPORT=true`` brings the handlers
back for a program that forks (``os.fork``, multiprocessing's ``fork`` start
method) and uses npstream in the child after the parent did, which without
them hangs (docs/spark.md, "gRPC and fork"). The variable is set in
``os.environ``, so child processes (Spark's JVM and Python workers) inherit it.
"""

from __future__ import annotations

import os

__all__ = ["FORK_SUPPORT_DEFAULT", "FORK_SUPPORT_ENV", "apply_default"]

FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"
FORK_SUPPORT_DEFAULT = "false"


def apply_default() -> None:
    """Set ``GRPC_ENABLE_FORK_SUPPORT=false`` unless the environment already names a value.

    Has an effect on this process only when grpc is not imported yet, which
    the package ``__init__`` ensures for its own imports.
    """
    os.environ.setdefault(FORK_SUPPORT_ENV, FORK_SUPPORT_DEFAULT)


apply_default()
