"""@grpc_errors: named errors become context.abort(code, message); anything else propagates."""

from __future__ import annotations

import grpc
import pytest

from services.common import errors
from services.common.errors import (
    DataLossError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
    grpc_errors,
    map_error,
    status_of,
)


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted

    def add_done_callback(self, callback) -> None:
        """A streaming handler's generators are closed when the RPC ends: these tests end none."""


class ForeignError(Exception):
    """Stands in for an engine/kvcache error registered with map_error."""


class ForeignChild(ForeignError):
    pass


map_error(ForeignError, grpc.StatusCode.FAILED_PRECONDITION)


class Servicer:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    @grpc_errors
    async def Unary(self, request, context):
        if self.error:
            raise self.error
        return "ok"

    @grpc_errors
    async def Stream(self, request, context):
        yield 1
        if self.error:
            raise self.error
        yield 2


@pytest.mark.parametrize(
    ("error", "code", "details"),
    [
        (InvalidArgumentError("sampling.temperature", "must be >= 0"), grpc.StatusCode.INVALID_ARGUMENT,
         "sampling.temperature: must be >= 0"),
        (ResourceExhaustedError("no free blocks"), grpc.StatusCode.RESOURCE_EXHAUSTED, "no free blocks"),
        (UnavailableError("draining"), grpc.StatusCode.UNAVAILABLE, "draining"),
        (DeadlineExceededError("deadline passed"), grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed"),
        (NotFoundError("request r1"), grpc.StatusCode.NOT_FOUND, "request r1"),
        (DataLossError("crc"), grpc.StatusCode.DATA_LOSS, "crc"),
        (ForeignChild("model differs"), grpc.StatusCode.FAILED_PRECONDITION, "model differs"),
    ],
)
async def test_named_errors_abort_with_their_code(error, code, details):
    context = FakeContext()
    with pytest.raises(Aborted):
        await Servicer(error).Unary(None, context)
    assert context.aborted == (code, details)

    context = FakeContext()
    received = []
    with pytest.raises(Aborted):
        async for item in Servicer(error).Stream(None, context):
            received.append(item)
    assert received == [1]
    assert context.aborted == (code, details)


async def test_success_passes_through():
    assert await Servicer(None).Unary(None, FakeContext()) == "ok"
    assert [i async for i in Servicer(None).Stream(None, FakeContext())] == [1, 2]


async def test_unmapped_errors_are_not_swallowed():
    context = FakeContext()
    with pytest.raises(KeyError):
        await Servicer(KeyError("bug")).Unary(None, context)
    assert context.aborted is None
    with pytest.raises(TypeError):
        status_of(KeyError("bug"))


def test_decorator_refuses_sync_methods():
    with pytest.raises(TypeError, match="async"):
        errors.grpc_errors(lambda self, request, context: None)
