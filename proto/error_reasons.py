"""Each ErrorReason's contract, read from its ``(error)`` option in npstream.proto.

The option on each ``ErrorReason`` value is the one place a reason is
declared: the gRPC status code it travels with, the Python SDK's exception
class and that class's bases, and the trailing metadata keys sent beside it.
The broker maps its errors to statuses from here (npstream.broker.rpc.status)
and fills their trailing metadata from here (npstream.broker.errors); the SDK
builds ``REASON_CLASSES`` from here and checks its classes' bases against it
(npstream.errors); proto/generate.py writes docs/client.md's table from it.
Nothing here imports grpc: a status is its code's name, so the storage engine
can raise broker errors without loading the transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from npstream.proto import metadata_keys, pb

__all__ = ["PREFIX", "SPECS", "ReasonSpec", "attribute_of"]

PREFIX = "ERROR_REASON_"


@dataclass(frozen=True)
class ReasonSpec:
    """One reason's ``(error)`` option, with the reason's number and enum name."""

    reason: pb.ErrorReason
    name: str  # the enum name, what `x-npstream-reason` carries
    status: str  # the gRPC status code's name ("NOT_FOUND")
    client_class: str
    client_bases: tuple[str, ...]
    trailing: tuple[str, ...]

    @property
    def short(self) -> str:
        """The name without its ERROR_REASON_ prefix, as tables show it."""
        return self.name.removeprefix(PREFIX)


def attribute_of(key: str) -> str:
    """The error attribute that holds a trailing metadata key's value, on both sides.

    One spelling for both: ``x-npstream-start-offset`` is ``start_offset``.
    """
    return key.removeprefix("x-npstream-").replace("-", "_")


_KNOWN_KEYS = frozenset(getattr(metadata_keys, name) for name in metadata_keys.__all__
                        if isinstance(getattr(metadata_keys, name), str))


def _read() -> Mapping[pb.ErrorReason, ReasonSpec]:
    """Every reason's spec; a value without a complete option fails the import (not a call)."""
    specs: dict[pb.ErrorReason, ReasonSpec] = {}
    bases_of: dict[str, tuple[str, ...]] = {}
    for value in pb.ErrorReason.DESCRIPTOR.values:
        if value.number == pb.ERROR_REASON_UNSPECIFIED:
            continue
        # The generated stubs type the extension as a plain FieldDescriptor.
        option = cast(pb.ErrorSpec, value.GetOptions().Extensions[cast(Any, pb.error)])
        spec = ReasonSpec(cast(pb.ErrorReason, value.number), value.name, option.status,
                          option.client_class, tuple(option.client_bases),
                          tuple(option.trailing))
        if not (spec.status and spec.client_class and spec.client_bases):
            raise RuntimeError(f"{value.name} in npstream.proto lacks status, client_class "
                               "or client_bases in its (error) option")
        unknown = set(spec.trailing) - _KNOWN_KEYS
        if unknown:
            raise RuntimeError(f"{value.name}'s trailing keys {sorted(unknown)} are not in "
                               "npstream.proto.metadata_keys")
        # A class that serves two reasons (BrokerUnavailable) has one set of bases.
        if bases_of.setdefault(spec.client_class, spec.client_bases) != spec.client_bases:
            raise RuntimeError(f"{value.name} gives {spec.client_class} other bases than "
                               "another reason does")
        specs[spec.reason] = spec
    return MappingProxyType(specs)


# Every ErrorReason but UNSPECIFIED, in enum order.
SPECS: Mapping[pb.ErrorReason, ReasonSpec] = _read()
