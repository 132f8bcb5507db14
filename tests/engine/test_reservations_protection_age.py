"""The oldest waiter's protection has an end: a request refused for room keeps its blocks held back from
other grants for at most ``max_protected_s`` after its first refusal (about how long a prefill node asks
for one request), then goes to the back of the line. So a caller re-asking a large reservation that never
fits cannot hold capacity longer than a legitimate waiter would wait; a waiter behind it is protected
next. No model, a fake clock."""

from __future__ import annotations

from services.engine.reservations import Refusal, Reservation
from tests.engine.test_reserve_fairness import Clock, _book, _reserve


def test_a_waiter_re_asking_past_its_protection_goes_to_the_back_of_the_line():
    clock = Clock()
    book = _book(clock)  # 16 blocks
    assert isinstance(_reserve(book, "running", 6), Reservation)  # 10 free
    assert isinstance(_reserve(book, "hog", 12), Refusal)  # never fits while "running" holds its blocks
    clock.now += 1.0
    refused = _reserve(book, "small", 4)  # would fit in the 10 free blocks, but "hog" waited longer
    assert isinstance(refused, Refusal) and "'hog'" in refused.reason, refused
    for _ in range(30):  # "hog" re-asks every second, keeping itself "present"
        clock.now += 1.0
        assert isinstance(_reserve(book, "hog", 12), Refusal)
        if clock.now == 29.0:  # within its 30 s its blocks are still kept from "small"
            refused = _reserve(book, "small", 4)
            assert isinstance(refused, Refusal) and "'hog'" in refused.reason, refused
    assert book.waiters.protected("small") is not None  # 31 s after its first refusal: still recorded
    clock.now += 0.5
    granted = _reserve(book, "small", 4)  # "hog" had its 30 s: "small" (waiting 30.5 s) now goes first
    assert isinstance(granted, Reservation), granted
    assert isinstance(_reserve(book, "hog", 12), Refusal)  # recorded anew, at the back of the line
    assert book.waiters.protected("other").request_id == "hog"  # the oldest again once nobody older waits
    for rid in ("running", "small", "hog"):
        book.cancel(rid)
    assert book.kv.num_free_blocks == book.kv.num_blocks

