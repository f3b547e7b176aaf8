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
others sleep in :meth:`Slot.take`. There are two ways out of the slot for a wait:

- :func:`stepped_out`, for a call that always waits on another process (the conductor,
  Placement, Keystone's HTTP API, a client that does not read its answer): the slot
  goes to a sleeping thread at once, which takes over the loop; when the wait ends the
  thread asks for the slot back, ahead of the threads that merely want to poll, and the
  holder hands it over at its next turn (``on_wanted`` wakes a holder idle in its epoll).
- :func:`blocking`, for a call that nearly always returns at once but may wait without
  bound on something outside the worker: a database statement (a row or table lock held
  by another transaction, a migration's lock, the server's network), or a token check
  that finds its answer in a cache. Handing the slot over for each would cost two
  thread switches per statement, so the holder keeps it, and one sleeping thread (the
  watcher) wakes every :data:`HAND_OFF_AFTER` to look: a call running longer than that
  loses the slot to the watcher, which takes over the loop, as a blocked system call
  loses its processor to another thread in Go's scheduler. The call's thread asks for
  the slot back when the call returns, as from :func:`stepped_out`. So a call that
  blocks stops the worker's other requests for at most :data:`HAND_OFF_AFTER`, and the
  cost when nothing blocks is two uncontended lock round trips per call and the
  watcher's few wake-ups a second.

The slot is for speed only: the connection loop keeps its own state under its own lock
(it also runs without a slot, every thread at once), so a thread whose call lost the
slot and a new holder may both run Python code for a moment without harm. Each waiting
thread is one of ``[api] threads``: that many waits at once, and the worker serves
nothing new until one ends (docs/security.md, "Slow clients"). Outside a slot holder
(the conductor, a CLI, a test) :func:`stepped_out` and :func:`blocking` do nothing.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

_holder = threading.local()

# How long a :func:`blocking` call keeps the slot before the watcher takes it over: well
# under the 1 s in which the version document and /healthcheck must answer, and well over
# a statement's or a cached token check's usual time (a 10,000-device list: 29 ms).
HAND_OFF_AFTER = 0.2


class Slot:
    """The right to run this process's connection loop; those coming back from a wait
    are served before those that want to poll."""

    def __init__(self, hand_off_after: float = HAND_OFF_AFTER) -> None:
        self._lock = threading.Lock()
        self._returners = threading.Condition(self._lock)
        self._pollers = threading.Condition(self._lock)
        self._held = False
        self._returning = 0
        self._closed = False
        self._hand_off_after = hand_off_after
        self._watching = False  # a poller waits with a timeout, watching the holder
        # The holder's :func:`blocking` call: (its thread, since when), or None.
        self._blocked: tuple[int, float] | None = None
        # Threads whose blocking call outlasted ``hand_off_after``: the slot went on
        # without them, and they take it back when the call returns.
        self._passed_over: set[int] = set()
        # Called when a thread coming back from a wait wants the slot: the loop makes
        # its epoll return, so an idle holder hands over at once.
        self.on_wanted: Callable[[], None] | None = None

    def take(self, returning: bool = False) -> None:
        """Wait for the slot; ``returning``: a thread coming back from a wait (first)."""
        with self._lock:
            self._take_locked(returning)

    def _take_locked(self, returning: bool) -> None:
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
            self._wait_as_poller()
        self._held = not self._closed
        _holder.slot = self if self._held else None

    def _wait_as_poller(self) -> None:
        """Wait until the slot is free, or (the watcher) until the holder's blocking
        call has run ``hand_off_after``: then the slot is this thread's."""
        watching = False
        try:
            while (self._held or self._returning) and not self._closed:
                if not self._watching:
                    self._watching = watching = True
                if not watching:
                    self._pollers.wait()
                    continue
                blocked = self._blocked
                if blocked is None:
                    self._pollers.wait(self._hand_off_after)
                    continue
                left = blocked[1] + self._hand_off_after - time.monotonic()
                if left > 0:
                    self._pollers.wait(left)
                    continue
                self._passed_over.add(blocked[0])  # the slot goes on without it
                self._blocked = None
                return
        finally:
            if watching:
                self._watching = False
                self._pollers.notify()  # another sleeping thread watches on

    def give(self) -> None:
        """Let the next thread have the slot: one coming back from a wait if any."""
        _holder.slot = None
        me = threading.get_ident()
        with self._lock:
            if me in self._passed_over:  # a blocking call lost it: it is another's now
                self._passed_over.discard(me)
                return
            self._blocked = None
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

    def _block(self) -> None:
        """The holder begins a call that may block (see :func:`blocking`)."""
        with self._lock:
            self._blocked = (threading.get_ident(), time.monotonic())

    def _unblock(self) -> None:
        """The call returned: go on, or take the slot back if it went on without us."""
        me = threading.get_ident()
        with self._lock:
            if me in self._passed_over:
                self._passed_over.discard(me)
                self._take_locked(returning=True)
            elif self._blocked is not None and self._blocked[0] == me:
                self._blocked = None

    def passed_over(self) -> bool:
        """Whether the calling thread's blocking call lost the slot (tests, assertions)."""
        return threading.get_ident() in self._passed_over


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
        if getattr(_holder, "blocking", 0):
            slot._block()  # inside a blocking call: it goes on being one


@contextmanager
def blocking() -> Iterator[None]:
    """Run a call that may block on something outside the worker while keeping the slot;
    the slot goes on without it if it runs past ``HAND_OFF_AFTER``, and it is taken back
    before returning (see the module docstring). Nested calls count as the outer one."""
    slot: Slot | None = getattr(_holder, "slot", None)
    if slot is None:
        yield
        return
    depth = getattr(_holder, "blocking", 0)
    _holder.blocking = depth + 1
    if not depth:
        slot._block()
    try:
        yield
    finally:
        _holder.blocking = depth
        if not depth:
            slot._unblock()


def holds_slot() -> bool:
    """Whether the calling thread holds a serving slot now (tests and assertions)."""
    slot: Slot | None = getattr(_holder, "slot", None)
    return slot is not None and not slot.passed_over()
