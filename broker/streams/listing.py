"""Listings: the streams a ListStreams page or an EndOffsets pattern covers, in name order.

Streams as cheap as keys (docs/scaling.md): names are read from
SQLite's primary-key order of the ``streams`` table (a prefix, or a glob's
literal prefix, is a range of it) in chunks instead of sorting every name in
memory, so a page of a million streams costs the page, not the million. What
a listing reports of each stream is the registry's (``describe``, offsets);
this module only decides which streams and in which pages.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

from npstream.broker.errors import InvalidArgumentError, StreamNotFoundError
from npstream.broker.metadata import Metadata
from npstream.broker.streams.names import literal_prefix, next_page_token, page_after
from npstream.broker.streams.records import StreamStatus
from npstream.broker.streams.tuning import LIST_CHUNK
from npstream.proto.defaults import DEFAULT_LIST_PAGE_SIZE, MAX_LIST_PAGE_SIZE

__all__ = ["StreamListing"]

# Above every character a stream name may hold: prefix + this bounds a prefix's range.
_AFTER_NAME_CHARS = "\x7f"


class StreamListing:
    """Listings over the registry's streams table; the registry answers for each stream.

    ``describe(name)`` and ``offsets(name)`` (start, end) raise
    StreamNotFoundError for a stream deleted meanwhile, which a listing skips;
    ``check(name)`` raises it for a named stream that does not exist;
    ``after_page()`` runs once a page is described.
    """

    def __init__(self, metadata: Metadata, describe: Callable[[str], StreamStatus],
                 check: Callable[[str], object], offsets: Callable[[str], tuple[int, int]],
                 after_page: Callable[[], None]) -> None:
        self._metadata = metadata
        self._describe = describe
        self._check = check
        self._offsets = offsets
        self._after_page = after_page

    def matching(self, prefix: str = "", pattern: str = "", after: str = "",
                 limit: int = 0, visible: Callable[[str], bool] | None = None) -> list[str]:
        """Sorted names with the prefix, matching the glob (case-sensitive), after a name.

        At most ``limit`` names (0: all); ``visible(name)`` drops names first.
        Read from the longer of the prefix and the glob's literal prefix.
        """
        start = literal_prefix(pattern) if pattern else ""
        if not start.startswith(prefix):
            if not prefix.startswith(start):
                return []  # the prefix and the glob cannot both match
            start = prefix
        stop = start + _AFTER_NAME_CHARS
        cursor = max(after, start)
        inclusive = cursor == start and cursor != after
        found: list[str] = []
        while True:
            names = [row[0] for row in self._metadata.execute_tuples(
                f"SELECT name FROM streams WHERE name {'>=' if inclusive else '>'} ? "
                "AND name < ? ORDER BY name LIMIT ?", (cursor, stop, LIST_CHUNK))]
            for name in names:
                if ((not pattern or fnmatch.fnmatchcase(name, pattern))
                        and (visible is None or visible(name))):
                    found.append(name)
                    if limit and len(found) >= limit:
                        return found
            if len(names) < LIST_CHUNK:
                return found
            cursor, inclusive = names[-1], False

    def page(self, prefix: str, pattern: str, page_size: int, page_token: str,
             visible: Callable[[str], bool] | None) -> tuple[list[StreamStatus], str]:
        """One page of streams in name order and the token of the next page ("" at the end).

        ``visible(name)`` (the caller's read right) drops names before the page
        is cut, so a page is never short because of streams the caller may not see.
        """
        if page_size < 0:
            raise InvalidArgumentError(f"page_size={page_size} must be >= 0")
        size = min(page_size or DEFAULT_LIST_PAGE_SIZE, MAX_LIST_PAGE_SIZE)
        names = self.matching(prefix, pattern, page_after(page_token), limit=size + 1,
                              visible=visible)
        page = names[:size]
        statuses: list[StreamStatus] = []
        for name in page:
            try:
                statuses.append(self._describe(name))
            except StreamNotFoundError:  # deleted while listing
                continue
        token = next_page_token(page[-1]) if len(names) > size else ""
        self._after_page()
        return statuses, token

    def end_offsets(self, names: Iterable[str], pattern: str,
                    visible: Callable[[str], bool] | None) -> list[tuple[str, int, int]]:
        """(name, start_offset, end_offset) for the named streams plus those matching pattern.

        ``visible(name)`` filters the pattern's matches (the caller's read
        right; named streams are the caller's to check).
        """
        wanted: dict[str, None] = {}
        for name in names:
            self._check(name)
            wanted[name] = None
        if pattern:
            wanted.update(dict.fromkeys(self.matching(pattern=pattern, visible=visible)))
        result: list[tuple[str, int, int]] = []
        for name in wanted:
            try:
                start, end = self._offsets(name)
            except StreamNotFoundError:  # deleted meanwhile; only named ones are errors
                continue
            result.append((name, start, end))
        return result
