"""Resendable: the unanswered requests of a streamed publish_batch, sent again by a new call."""

from __future__ import annotations

import itertools

from npstream.client.resend import Resendable


def test_a_new_feed_sends_the_unanswered_requests_first_then_the_rest_in_order():
    requests = Resendable(iter([b"r0", b"r1", b"r2", b"r3", b"r4"]))
    first = requests.feed()
    assert list(itertools.islice(first, 3)) == [b"r0", b"r1", b"r2"]
    assert requests.answered() == 0  # r0 stored; r1, r2 refused with the call
    assert requests.pending == 2
    second = requests.feed()
    assert next(first, None) is None  # the older call's feed stops: the newer one sends
    assert list(second) == [b"r1", b"r2", b"r3", b"r4"]
    assert [requests.answered() for _ in range(4)] == [1, 2, 3, 4]
    assert requests.pending == 0


def test_a_request_an_ended_call_took_after_the_refusal_is_not_lost():
    requests = Resendable(iter([b"r0", b"r1", b"r2"]))
    old = requests.feed()
    assert next(old) == b"r0"
    assert next(old) == b"r1"  # taken by the ended call's sending thread, never sent
    assert list(requests.feed()) == [b"r0", b"r1", b"r2"]
