"""Every exception class of the broker lives in an errors module.

BrokerErrors (what a client is told) in npstream.broker.errors; a package's
own errors, handled inside the broker, in that package's errors module.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import npstream.broker as broker_package


def _broker_exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(broker_package.__path__, "npstream.broker."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and issubclass(obj, BaseException):
                found.append(obj)
    return found


def test_every_broker_exception_class_lives_in_an_errors_module() -> None:
    classes = _broker_exception_classes()
    names = {c.__name__ for c in classes}
    assert {"TokensFileError", "MoveFailedError", "UndoFailedError", "PeerError"} <= names
    elsewhere = [f"{c.__module__}.{c.__qualname__}" for c in classes
                 if not c.__module__.endswith(".errors")]
    assert elsewhere == []
    assert {c.__module__ for c in classes} == {
        "npstream.broker.errors", "npstream.broker.auth.errors",
        "npstream.broker.cluster.errors", "npstream.broker.server.errors",
        "npstream.broker.sink.errors", "npstream.broker.storage.errors",
        "npstream.broker.kafka.errors"}
