"""The serving slot: in an API worker one thread at a time runs the connection loop (waits
in its epoll, reads heads, serves requests), and a thread that waits for another service
steps out so that the next thread takes over.

Why: threads that share one GIL and all serve hand the GIL to each other at every
system call, and that cost more than the handlers themselves. Measured with
bench/server_compare.py (one worker, 4 kept-alive clients): four threads serving at once
spent 477 us of CPU per version document against 229 us for one thread, and listed 1,000
ARQs at 0.67x one thread's rate. One thread alone, though, would stop the worker for as
long as one request waits: a bind PATCH waits up to ``[api] bind_wait`` for the
conductor, a synchronous program for minutes, a slow client for its answer.

So the worker keeps ``[api] threads`` threads, and only the slot's holder runs the loop
(a leader and its followers): while nothing waits, one thread does everything and the
others sleep in :meth:`Slot.take`, costing nothing, not even a wake-up per request. Code
that blocks on something other than the CPU or the local database (the conductor,
Placement, a client that does not read its answer) runs inside :func:`stepped_out`: the
slot goes to a sleeping thread, which takes over the loop; when the wait ends the thread
asks for the slot back, ahead of the threads that merely want to poll, and the holder
hands it over at its next turn (``on_wanted`` wakes a holder idle in its epoll). Outside
a slot holder (the conductor, a CLI, a test) :func:`stepped_out` does nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_holder = threading.local()


class Slot:
    """The right to run this process's connection loop; those coming back from a wait
    are served before those that want to poll."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._returners = threading.Condition(self._lock)
        self._pollers = threading.Condition(self._lock)
        self._held = False
        self._returning = 0
        self._closed = False
        # Called (outside the lock) when a thread coming back from a wait wants the slot:
        # the loop makes its epoll return, so an idle holder hands over at once.
        self.on_wanted: Callable[[], None] | None = None

    def take(self, returning: bool = False) -> None:
        """Wait for the slot; ``returning``: a thread coming back from a wait (first)."""
        with self._lock:
            if returning:
                self._returning += 1
                try:
                    if self._held and self.on_wanted is not None:
                        self.on_wanted()
                    while self._held and not self._closed:
                        self._returners.wait()
                finally:
                    self._returning -= 1
            else:
                while (self._held or self._returning) and not self._closed:
                    self._pollers.wait()
            self._held = not self._closed
            _holder.slot = self if self._held else None

    def give(self) -> None:
        """Let the next thread have the slot: one coming back from a wait if any."""
        _holder.slot = None
        with self._lock:
            self._held = False
            if self._returning:
                self._returners.notify()
            else:
                self._pollers.notify()

    def wanted(self) -> bool:
        """Whether a thread coming back from a wait is waiting for the slot (the holder
        then gives it and takes it again: after that thread)."""
        return self._returning > 0

    def close(self) -> None:
        """Stopping: every waiter goes on without the slot (nothing is served anew)."""
        with self._lock:
            self._closed = True
            self._returners.notify_all()
            self._pollers.notify_all()

    @contextmanager
    def held(self) -> Iterator[None]:
        self.take()
        try:
            yield
        finally:
            self.give()


@contextmanager
def stepped_out() -> Iterator[None]:
    """Run the block without the calling thread's slot, if it holds one (a wait for
    another service or a client), and take the slot back before returning."""
    slot: Slot | None = getattr(_holder, "slot", None)
    if slot is None:
        yield
        return
    slot.give()
    try:
        yield
    finally:
        slot.take(returning=True)


def holds_slot() -> bool:
    """Whether the calling thread holds a serving slot now (tests and assertions)."""
    return getattr(_holder, "slot", None) is not None
