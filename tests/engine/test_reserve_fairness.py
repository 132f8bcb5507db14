"""A large prompt refused for room on a decode node is not starved by smaller requests that ask after it:
the blocks the oldest refused request still asking needs are kept from other grants and adoptions; only
that one is protected, a waiter that stopped asking stops counting, and an abort forgets it. No model."""

from __future__ import annotations

from kvcache.hashing import model_fingerprint
from kvcache.manager import KVCacheManager
from services.engine.request import Request
from services.engine.reservations import Refusal, Reservation, ReservationBook
from services.engine.reserve_waiters import ReserveWaiters
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.step_batch import SchedulerConfig

BLOCK = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _book(clock: Clock, num_blocks: int = 16) -> ReservationBook:
    kv = KVCacheManager(num_blocks, BLOCK, model_fingerprint(model="fairness-test"))
    return ReservationBook(kv, Scheduler(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=64), kv),
                           clock=clock)


def _request(rid: str, num_blocks: int) -> Request:
    prompt = [hash((rid, i)) % 1000 + 1 for i in range(num_blocks * BLOCK)]  # no prefix shared between them
    return Request(rid, prompt, SamplingParams(max_tokens=1, ignore_eos=True))


def _reserve(book: ReservationBook, rid: str, num_blocks: int) -> Reservation | Refusal:
    return book.reserve(_request(rid, num_blocks), lease_s=30.0)


def _fill_then_refuse_big(book: ReservationBook) -> Refusal:
    """Eight small grants fill the pool; "big" (8 blocks) is refused and becomes a waiter."""
    for i in range(8):
        assert isinstance(_reserve(book, f"small{i}", 2), Reservation)
    big = _reserve(book, "big", 8)
    assert isinstance(big, Refusal)
    return big


def test_the_oldest_refused_request_gets_the_blocks_that_come_free():
    clock = Clock()
    book = _book(clock)
    big = _fill_then_refuse_big(book)
    assert "8 needed" in big.reason

    for i in range(4):  # small grants end one by one; a later small request asks first every time
        clock.now += 0.3
        book.cancel(f"small{i}")
        refused = _reserve(book, f"later{i}", 2)
        assert isinstance(refused, Refusal), f"later{i} took the blocks the older request waits for"
        assert "8 for 'big', which has waited longer" in refused.reason
        assert isinstance(_reserve(book, "big", 8), Reservation if i == 3 else Refusal)  # its retry
    refused = _reserve(book, "later9", 2)  # the pool is full again; the next oldest waiter is first in line
    assert isinstance(refused, Refusal) and "2 for 'later0', which has waited longer" in refused.reason
    book.kv.check_integrity()


def test_a_waiter_that_stopped_asking_or_was_aborted_holds_nothing_back():
    clock = Clock()
    book = _book(clock)
    _fill_then_refuse_big(book)
    book.cancel("small0")
    clock.now += 5.5  # "big" went elsewhere (or gave up): it asked nothing here for longer than present_s
    assert isinstance(_reserve(book, "later", 2), Reservation)

    assert isinstance(_reserve(book, "big2", 8), Refusal)
    book.cancel("small1")
    book.cancel("big2")  # aborted while it waited
    assert isinstance(_reserve(book, "later2", 2), Reservation)


def test_only_the_oldest_is_protected_and_records_are_bounded():
    clock = Clock()
    waiters = ReserveWaiters(present_s=1.5, forget_s=30.0, max_records=3, clock=clock)  # short, to test
    waiters.refused("a", 8)
    clock.now += 0.1
    waiters.refused("b", 4)
    assert waiters.protected("new").request_id == "a" and waiters.protected("b").request_id == "a"
    assert waiters.protected("a") is None  # the oldest asking is never held back by anyone
    clock.now += 1.0
    waiters.refused("b", 4)  # "a" stopped asking: "b" is the oldest still asking
    clock.now += 1.0
    assert waiters.protected("new").request_id == "b"
    waiters.refused("a", 8)  # "a" is back (from another decode node): it keeps its age
    assert waiters.protected("b").request_id == "a"
    waiters.refused("c", 1)
    waiters.refused("d", 1)  # over max_records: not remembered
    assert len(waiters) == 3
    clock.now += 31.0
    assert waiters.protected("new") is None and len(waiters) == 0  # forgotten once nobody asked for long


def test_stale_records_behind_one_still_asking_are_forgotten():
    clock = Clock()
    waiters = ReserveWaiters(present_s=5.0, forget_s=30.0, max_records=3, clock=clock)
    for rid in ("head", "gone", "gone2"):
        waiters.refused(rid, 2)
    for _ in range(7):  # the head keeps asking for 35 s; the others left long ago
        clock.now += 5.0
        waiters.refused("head", 8)
    assert waiters.protected("new").request_id == "head" and len(waiters) == 1
    waiters.refused("later", 1)
    assert len(waiters) == 2  # room for new records again


def test_an_adoption_does_not_take_the_blocks_an_older_refused_request_waits_for():
    from services.engine.adoption import Adoptions
    from services.engine.handover import HandedRequest

    clock = Clock()
    book = _book(clock)
    _fill_then_refuse_big(book)
    book.cancel("small0")
    adoptions = Adoptions(book.kv, book.scheduler, book)
    handed = HandedRequest(request_id="handed", prompt_token_ids=tuple(range(1, 5)), output_token_ids=(9,),
                           sampling=SamplingParams(max_tokens=4, ignore_eos=True), num_computed_tokens=4,
                           kv_keys=(b"k" * 32,), cached_tokens=0, num_preemptions=1)
    refused = adoptions.adopt(handed, eos_token_ids=(), lease_s=30.0)
    assert isinstance(refused, Refusal) and "for 'big', which has waited longer" in refused.reason
