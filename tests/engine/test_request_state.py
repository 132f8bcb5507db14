"""The request state machine allows only the documented transitions."""

from __future__ import annotations

import pytest

from services.engine.request import IllegalTransitionError, Request, RequestStatus
from services.engine.sampling_params import SamplingParams

S = RequestStatus


def _request() -> Request:
    return Request("r", [1, 2, 3], SamplingParams())


def test_life_of_a_request():
    r = _request()
    for status in (S.RUNNING_PREFILL, S.RUNNING_DECODE, S.PREEMPTED, S.RUNNING_PREFILL, S.RUNNING_DECODE,
                   S.FINISHED_LENGTH):
        r.transition(status)
    assert r.status.finished and r.finish_reason == "length"


@pytest.mark.parametrize(("path", "bad"), [
    ((), S.FINISHED_STOPPED),
    ((S.RUNNING_PREFILL, S.FINISHED_STOPPED), S.PREEMPTED),
    ((S.RUNNING_PREFILL, S.FINISHED_STOPPED), S.RUNNING_DECODE),
    ((S.RUNNING_PREFILL, S.RUNNING_DECODE), S.RUNNING_PREFILL),
    ((S.FINISHED_ABORTED,), S.RUNNING_PREFILL),
])
def test_illegal_transitions_raise(path, bad):
    r = _request()
    for status in path:
        r.transition(status)
    with pytest.raises(IllegalTransitionError):
        r.transition(bad)


def test_finish_reasons():
    assert S.FINISHED_STOPPED.finish_reason == "stop"
    assert S.FINISHED_ABORTED.finish_reason == "abort"
    assert S.RUNNING_DECODE.finish_reason is None
