"""``max_num_seqs`` on a decode node: a grant takes a batch slot, so requests committed from prefill nodes
(or adopted) never make a step batch more than ``max_num_seqs`` requests. No model needed."""

from __future__ import annotations

from kvcache.hashing import model_fingerprint
from kvcache.manager import KVCacheManager
from services.engine.request import Request
from services.engine.reservations import Refusal, Reservation, ReservationBook
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from services.engine.step_batch import SchedulerConfig

MAX_SEQS = 2


def _book(max_seqs: int = MAX_SEQS) -> ReservationBook:
    kv = KVCacheManager(64, 4, model_fingerprint(model="slots-test"))
    return ReservationBook(kv, Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=64), kv))


def _request(i: int) -> Request:
    return Request(f"r{i}", [10 + i, 11, 12, 13, 14], SamplingParams(max_tokens=8, ignore_eos=True))


def _commit(book: ReservationBook, request: Request) -> None:
    granted = book.reserve(request, lease_s=30.0)
    assert isinstance(granted, Reservation), granted
    book.receive(request.request_id, granted.pending_block_ids)
    book.commit(request.request_id, first_token_id=7)


def test_a_grant_needs_a_free_slot_counting_running_and_granted_requests():
    book = _book()
    _commit(book, _request(0))
    assert isinstance(book.reserve(_request(1), lease_s=30.0), Reservation)  # granted, not yet committed
    free = book.kv.num_free_blocks
    refused = book.reserve(_request(2), lease_s=30.0)
    assert isinstance(refused, Refusal) and "max_num_seqs 2" in refused.reason
    assert "1 running" in refused.reason and "1 granted" in refused.reason
    assert book.kv.num_free_blocks == free and not book.kv.has_request("r2")  # a refusal takes nothing
    book.cancel("r1")
    _commit(book, _request(2))
    assert len(book.scheduler.schedule().scheduled) == MAX_SEQS
    book.kv.check_integrity()


def test_a_step_batches_at_most_max_num_seqs_even_when_more_are_running():
    book = _book(max_seqs=3)
    for i in range(3):
        _commit(book, _request(i))
    scheduler = book.scheduler
    scheduler.config = SchedulerConfig(max_num_seqs=MAX_SEQS, max_num_batched_tokens=64)  # lowered under them
    batch = scheduler.schedule()
    assert [s.request.request_id for s in batch.scheduled] == ["r0", "r1"]
    assert len(scheduler.running) == 3  # the third waits for a slot, holding its blocks
