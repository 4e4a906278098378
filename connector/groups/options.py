"""A shared-group consumer's settings, as one object for every way of consuming.

``receive``, ``receive_batch``, ``receive_batches`` and ``subscribe`` take
the same six settings; ``GroupOptions`` holds them once, so an application
builds them in one place and passes ``options=`` to each call
(docs/groups.md "Group options"). The six keyword arguments those calls
took before are still accepted, and win over ``options`` (``with_keywords``).
The values are checked when a call uses them, before any round trip
(npstream.groups.leases.shared_group_config). Nothing here loads more than
the standard library, since ``import npstream`` exports the class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GroupOptions"]


@dataclass(frozen=True)
class GroupOptions:
    """How a member of a shared group consumes (docs/groups.md "Group options").

    ``ack_wait``: seconds (or a duration string such as ``"30s"``) a lease
    lasts before the message goes to another member. ``max_deliver``:
    attempts before a message is dead-lettered (0 = unlimited). ``backoff``:
    seconds to wait before each redelivery after a nack or expiry.
    ``dead_letter_stream``: where dead letters go (None: ``<stream>.dlq``).
    ``ordering``: ``"key"`` (one unfinished message per key), ``"none"``, or
    None to keep the group's. ``member_id``: this member's name in the group
    (None: one made from the host and process).
    """

    ack_wait: float | str = 30.0
    max_deliver: int = 0
    backoff: Sequence[float] | None = None
    dead_letter_stream: str | None = None
    ordering: str | None = None
    member_id: str | None = None

    def __post_init__(self) -> None:
        if self.backoff is not None and not isinstance(self.backoff, tuple):
            # A tuple, so the options stay immutable and hashable like the rest.
            object.__setattr__(self, "backoff", tuple(self.backoff))

    def with_keywords(self, keywords: Mapping[str, Any], call: str) -> GroupOptions:
        """These options with the keyword arguments of ``call`` applied over them.

        A keyword that is not a setting is a TypeError naming the accepted ones,
        as an unexpected keyword argument always was.
        """
        if not keywords:
            return self
        unknown = sorted(set(keywords) - _FIELDS)
        if unknown:
            raise TypeError(f"{call}() got unexpected keyword argument(s) {unknown}; the group "
                            f"settings are {sorted(_FIELDS)} (or options=GroupOptions(...))")
        return dataclasses.replace(self, **keywords)


_FIELDS = frozenset(field.name for field in dataclasses.fields(GroupOptions))
DEFAULT_OPTIONS = GroupOptions()


def group_options(options: GroupOptions | None, keywords: Mapping[str, Any],
                  call: str) -> GroupOptions:
    """The settings of one call: ``options`` (or the defaults) with its keywords over them."""
    if options is not None and not isinstance(options, GroupOptions):
        raise TypeError(f"{call}(): options must be a GroupOptions, got "
                        f"{type(options).__name__}")
    return (options or DEFAULT_OPTIONS).with_keywords(keywords, call)
