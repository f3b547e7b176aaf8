"""The serving slot: in an API worker one thread at a time runs the application, and a
thread that waits for another service steps out so that the next request is served.

Why: threads that share one GIL and all run handlers hand the GIL to each other at every
system call, and that cost more than the handlers themselves. Measured with
bench/server_compare.py (one worker, 4 kept-alive clients): four threads serving at once
spent 477 us of CPU per version document against 229 us for one thread, and listed 1,000
ARQs at 0.67x one thread's rate. One thread alone, though, would stop the worker for as
long as one request waits: a bind PATCH waits up to ``[api] bind_wait`` for the
conductor, a synchronous program for minutes, a slow client for its answer.

So the worker keeps ``[api] threads`` threads on its connection loop, and a thread must
hold the slot to handle a connection's event (read a head, serve a request). The threads
without the slot sleep on the slot's lock or in the epoll, and cost nothing. Code that
blocks on something other than the CPU or the local database (the conductor, a client
that does not read its answer) runs inside :func:`stepped_out`: the slot goes to the next
thread meanwhile and is taken back afterwards. Outside a slot holder (the conductor, a
CLI, a test) :func:`stepped_out` does nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_holder = threading.local()


class Slot:
    """The right to run request handlers in this process's connection loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        self._lock.acquire()
        _holder.slot = self
        try:
            yield
        finally:
            _holder.slot = None
            self._lock.release()

    def _give_up(self) -> None:
        _holder.slot = None
        self._lock.release()

    def _take_back(self) -> None:
        self._lock.acquire()
        _holder.slot = self


@contextmanager
def stepped_out() -> Iterator[None]:
    """Run the block without the calling thread's slot, if it holds one (a wait for
    another service or a client), and take the slot back before returning."""
    slot: Slot | None = getattr(_holder, "slot", None)
    if slot is None:
        yield
        return
    slot._give_up()
    try:
        yield
    finally:
        slot._take_back()


def holds_slot() -> bool:
    """Whether the calling thread holds a serving slot now (tests and assertions)."""
    return getattr(_holder, "slot", None) is not None
