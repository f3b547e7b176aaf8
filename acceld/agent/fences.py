"""The agent's fence store: the lowest fencing token it still accepts, per handle and deployable.

A conductor takes a token with each claim that authorises a call to this agent (a handle's
release claim, a bind's prepare step, a program's mark: ``fence_token`` on the row, one more
per claim, in the claim's transaction) and sends it with the call. A conductor that stalled
past its claim (GC pause, SIGSTOP, slow disk) and resumes sends a token older than the one
a newer claim already sent here, and is refused: nothing it asks is done. The store keeps,
per key, the lowest token still accepted:

- ``handle:<uuid>``: a prepare or release with token *t* is accepted when *t* is at least
  the stored value, which becomes *t*. An **equal** token is accepted: it is the same claim
  sending its call again (a lost answer); the steps are idempotent.
- ``deployable:<uuid>``: a program with token *t* likewise. A bind's prepare also carries the
  deployable's token *m* as the bind read it: that bind took a handle while no programming
  mark held, so every program with a token up to *m* has ended or is stale, and the stored
  value becomes at least *m + 1*.

- ``local:...``: the device a key stands for as this agent names it (a handle's driver,
  attach type and info; a deployable's driver and name). At least 1 once any call with a
  token reached it: a call **without** a token (a conductor from before fencing) is then
  refused, as it could not be ordered after the fenced claims; before that it is accepted.
  A deployable's (``local:program:<driver>/<name>``) is also a floor of its own: a
  deployable discovered again (its host retired and registered anew) is a new row with a
  new uuid, so its ``deployable:`` key starts afresh, while the device it names is the same.
  A program is admitted only at or above both floors and raises both; a bind's fence or
  prepare raises both. A new row's tokens start above every token of an earlier row
  (acceld.db.fences.first_token), so whatever a new row tells this agent refuses the
  earlier rows' programs.

One file per key under ``<state_path>/agent/<host>/fences/``, written to a temporary file,
flushed with fsync and renamed over the old one (then the directory is synced) **before**
the step runs, so that an agent restarted after acting still refuses the older token. Checks
of one key are serialised within the process (every store on one directory shares the lock).
A call without a token (a conductor from before fencing) is not fenced while its device was
never reached by a call with one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import uuid as uuidlib
from typing import Any, Iterator, Sequence

import orjson
from oslo_config import cfg

LOG = logging.getLogger(__name__)

#: How a refusal's message begins: the conductor recognises a fenced 409 by it.
FENCED = "Fenced:"
MAX_TOKEN = 2 ** 63 - 1  # the columns are BIGINT

_GUARD = threading.Lock()
_LOCKS: dict[tuple[str, str], threading.Lock] = {}


_FLOOR = re.compile(r"older than ([0-9]{1,19}), the lowest this agent still accepts")


class Fenced(Exception):
    """The token is older than the lowest this agent still accepts for its key (409)."""

    def __init__(self, what: str, token: int, lowest: int) -> None:
        super().__init__(f"{FENCED} {what} was sent with fencing token {token}, older than "
                         f"{lowest}, the lowest this agent still accepts for it: a newer claim "
                         "acted on it meanwhile (the sending conductor stalled past its "
                         "claim), or the conductors' database is behind this agent (restored "
                         "from a backup taken before that claim). Nothing was done.")
        self.token = token
        self.lowest = lowest


class FencedWithoutToken(Fenced):
    """A token-less call for a device this agent has fenced (409)."""

    def __init__(self, what: str) -> None:
        Exception.__init__(self, f"{FENCED} {what} was sent without a fencing token (by a "
                                 "conductor from before fencing, or one that took this agent "
                                 "for one), but calls with tokens reached it before: it cannot "
                                 "be ordered after them. Nothing was done.")
        self.token = 0
        self.lowest = 1


class FenceStoreError(Exception):
    """The store could not be read or written: the step must not run (fail closed)."""


def floor_in(message: str) -> int | None:
    """The lowest token a :class:`Fenced` refusal's message names (None: another refusal),
    so that a conductor can tell whether its database is behind the agent."""
    found = _FLOOR.search(message)
    return int(found.group(1)) if found and message.startswith(FENCED) else None


def handle_key(handle_uuid: str) -> str:
    return f"handle:{handle_uuid}"


def deployable_key(deployable_uuid: str) -> str:
    return f"deployable:{deployable_uuid}"


def local_key(identity: str) -> str:
    """The key of a device as this agent names it (see the module)."""
    return f"local:{identity}"


def program_identity(driver_name: str, deployable_name: str) -> str:
    """A deployable as this agent names it, for :func:`local_key` (programs, prepares)."""
    return f"program:{driver_name}/{deployable_name}"


def is_uuid(value: Any) -> bool:
    """A uuid on the wire (the key of a handle or deployable)."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        uuidlib.UUID(value)
    except ValueError:
        return False
    return True


def valid_token(value: Any) -> bool:
    """A token on the wire: an integer (not a bool) from 0 to :data:`MAX_TOKEN`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN


def valid_bind_token(value: Any) -> bool:
    """A bind's deployable token on the wire (the floor becomes it + 1, which the store must
    still hold): an integer from 0 to :data:`MAX_TOKEN` - 1."""
    return valid_token(value) and value < MAX_TOKEN


class FenceStore:
    """Files under ``directory``, one per key: ``{"key": ..., "lowest": n}``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @classmethod
    def for_agent(cls, conf: cfg.ConfigOpts, hostname: str) -> "FenceStore":
        return cls(os.path.join(conf.state_path, "agent", hostname, "fences"))

    def _lock(self, key: str) -> threading.Lock:
        with _GUARD:
            return _LOCKS.setdefault((os.path.abspath(self.directory), key), threading.Lock())

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, f"{hashlib.sha256(key.encode()).hexdigest()}.json")

    def lowest(self, key: str) -> int:
        """The lowest token accepted for ``key`` now (0: never fenced)."""
        try:
            with open(self._path(key), "rb") as source:
                data = orjson.loads(source.read())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            raise FenceStoreError(f"the fence record of {key} in {self.directory} is "
                                  f"unreadable ({exc}); nothing is done until it is "
                                  "repaired") from None
        value = data.get("lowest") if isinstance(data, dict) else None
        if not valid_token(value) or data.get("key") != key:
            raise FenceStoreError(f"the fence record of {key} in {self.directory} is "
                                  "malformed; nothing is done until it is repaired")
        return int(value)

    def admit(self, key: str, token: int, what: str) -> None:
        """Accept ``token`` for ``key`` (raising :class:`Fenced` when it is older than the
        lowest accepted) and make it the lowest accepted, durably, before returning. The
        caller runs the step after this returns, under its own lock of the resource, so
        that no older call's step can run after a newer one was admitted."""
        with self._lock(key):
            self._admit(key, token, what)

    @contextlib.contextmanager
    def holding(self, keys: Sequence[str], token: int, what: str) -> Iterator[None]:
        """:meth:`admit` for every key at once (refused unless ``token`` is at least each
        key's floor, checked before any is written), with the keys' locks held, in the
        order given, until the block ends: the caller writes the device inside it, so that
        a :meth:`raise_to` of any of them (a bind's fence) either comes first and the write
        is refused, or waits until the write is over. A ``local:`` key becomes at least 1
        (:meth:`mark_fenced`)."""
        with contextlib.ExitStack() as locks:
            for key in keys:
                locks.enter_context(self._lock(key))
            floors = {key: self.lowest(key) for key in keys}
            highest = max(floors.values(), default=0)
            if token < highest:
                raise Fenced(what, token, highest)
            for key, lowest in floors.items():
                wanted = max(token, 1) if key.startswith("local:") else token
                if wanted > lowest:
                    self._write(key, wanted)
            yield

    def _admit(self, key: str, token: int, what: str) -> None:
        lowest = self.lowest(key)
        if token < lowest:
            raise Fenced(what, token, lowest)
        if token > lowest:
            self._write(key, token)

    def raise_to(self, key: str, lowest: int) -> None:
        """Refuse from now on every token below ``lowest`` for ``key`` (never lowers it)."""
        with self._lock(key):
            if lowest > self.lowest(key):
                self._write(key, lowest)

    def mark_fenced(self, key: str) -> None:
        """A call with a token reached the ``local:`` key: token-less calls are refused."""
        self.raise_to(key, 1)

    def admit_untokened(self, key: str, what: str) -> None:
        """A token-less call for the ``local:`` key: refused once it was fenced."""
        if self.lowest(key) > 0:
            raise FencedWithoutToken(what)

    def _write(self, key: str, lowest: int) -> None:
        path = self._path(key)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with open(tmp, "wb") as out:
                out.write(orjson.dumps({"key": key, "lowest": lowest}))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)  # the rename itself survives a power cut
            finally:
                os.close(directory)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise FenceStoreError(f"the agent could not record fencing token {lowest} of "
                                  f"{key} in {self.directory}: {exc}") from None


def raise_program_floor(store: FenceStore, driver_name: str, deployable_name: str,
                        deployable_uuid: str, lowest: int) -> None:
    """A bind read the deployable's token *m* (``lowest`` = *m* + 1): refuse every program
    below it, of this row (its uuid) and of any earlier row of the same device (the device as
    this agent names it), the device's key first, as :meth:`FenceStore.holding` locks."""
    store.raise_to(local_key(program_identity(driver_name, deployable_name)), max(lowest, 1))
    store.raise_to(deployable_key(deployable_uuid), lowest)
