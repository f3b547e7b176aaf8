"""Wake-ups of the bind workers, and waits for the binds they resolve.

An API worker that committed bind jobs calls the conductor's ``POST /binds/wake``.
:class:`WakeCalls` lets one bind worker go per call. :class:`ResolvedWatch` lets that
call, when it asks to, wait (bounded) until this conductor's workers have resolved the
ARQs it names, so that the PATCH answers once its binds are done, as upstream's does
for a bind with nothing to program, and a client's next GET finds them ``Bound``. The
bind itself stays the workers' (leases, retries, failover); a wait that runs out, or
whose jobs another conductor took, only means the PATCH answered before the bind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable


class WakeCalls:
    """Wake-ups for the bind workers, one worker per call.

    A wake for one bind used to wake every worker (a ``threading.Event``): each then spent
    its claims on an empty queue, and on SQLite those write transactions queued in front
    of the one that did the bind. A call now lets one waiting worker go (calls made while
    every worker is busy are kept, up to one per worker, so none is lost); a worker that
    leaves jobs due wakes the next (``BindWorker.on_claimed``)."""

    def __init__(self, workers: int) -> None:
        self._limit = workers
        self._pending = 0
        self._closed = False
        self._cond = threading.Condition()

    def wake(self) -> None:
        with self._cond:
            self._pending = min(self._limit, self._pending + 1)
            self._cond.notify()

    def wait(self) -> bool:
        """Block until a wake-up is this worker's; False once closed."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._pending -= 1
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ResolvedWatch:
    """Who waits for which ARQ ids; the bind workers announce each one they resolve."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: dict[int, int] = {}  # ARQ id -> how many waits name it
        self._resolved: set[int] = set()  # announced while someone waits for them

    def wait(self, arq_ids: Iterable[int], seconds: float,
             start: Callable[[], None] = lambda: None) -> int:
        """Watch ``arq_ids``, call ``start`` (the wake), and wait until every one of them
        is resolved or ``seconds`` pass; return how many were resolved."""
        ids = set(arq_ids)
        with self._cond:
            for arq_id in ids:
                self._waiting[arq_id] = self._waiting.get(arq_id, 0) + 1
        try:
            start()  # after the watch is set: a resolution cannot slip in between
            deadline = time.monotonic() + seconds
            with self._cond:
                while not ids <= self._resolved:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                return len(ids & self._resolved)
        finally:
            with self._cond:
                for arq_id in ids:
                    count = self._waiting.pop(arq_id) - 1
                    if count:
                        self._waiting[arq_id] = count
                    else:
                        self._resolved.discard(arq_id)

    def announce(self, arq_id: int) -> None:
        """A worker committed ``arq_id``'s outcome (``Bound`` or ``BindFailed``)."""
        with self._cond:
            if arq_id in self._waiting:
                self._resolved.add(arq_id)
                self._cond.notify_all()
