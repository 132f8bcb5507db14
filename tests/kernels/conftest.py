"""Kernel tests check numerics, not speed: run them on one thread so that a busy machine (OpenMP
threads waiting on a descheduled sibling) cannot stretch a sub-second suite into tens of seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
