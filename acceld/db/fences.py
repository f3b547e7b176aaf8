"""Fencing tokens: taken from the database with each claim that authorises an agent call.

``attach_handles.fence_token`` grows by one with each claim that may make an agent change
the handle on its host (a release claim, a bind's prepare step); ``deployables.fence_token``
with each programming mark. The token is taken in the claim's own transaction, so that a
later claim always holds a larger token than every earlier one, and the agent refuses a
token older than the newest it has seen (acceld.agent.fences; docs/architecture.md,
"Fencing"). The increment is one UPDATE of a row the claim writes or locks anyway.

Keys that come back. The agent keys a handle by its uuid, and an mdev handle's uuid is its
slot's (uuid5): a handle removed (its host retired) and discovered again is the same key, so
its token must go on from above every token the old row could have handed out, even to a
claim that never reached the agent. A new handle row therefore starts at
:func:`first_token`: the database's clock at the insert in milliseconds, shifted left by
:data:`EPOCH_BITS` (a row would need over a million claims per millisecond of its life to
reach the next row's start; the value fits BIGINT until the year 2248).

A deployable discovered again is a new row with a new uuid, but the agent also keys its
programs by the device it writes (acceld.agent.fences), so a new deployable row starts at
:func:`first_token` too, and its first bind tells the agent that token
(:func:`fence_untold`, :func:`record_told`): every program an earlier row of the device
handed out is then refused.

A database restored from a backup holds tokens below what the agents accepted since: the
agent refuses the next claim naming the lowest token it accepts. When a row's token is
below that floor no newer claim exists in the database (a claim's token is written before
its call), so the conductor raises the row to the floor (:func:`catch_up`) and sends again
with a newer token (docs/upgrades.md, "Restoring a backup").
"""

from __future__ import annotations

import datetime as dt
from typing import Sequence

from sqlalchemy import Connection, Table, select, update

from acceld.db.clock import db_now
from acceld.db.models import attach_handles, deployables

EPOCH_BITS = 20  # claims a row may take per millisecond of its life before the next's start


def first_token(conn: Connection) -> int:
    """The token a new handle or deployable row starts from: above every token an earlier
    row of the same uuid or device can have taken (see the module)."""
    now = db_now(conn).replace(tzinfo=dt.timezone.utc)
    return int(now.timestamp() * 1000) << EPOCH_BITS


def catch_up(conn: Connection, table: Table, row_id: int, floor: int) -> int | None:
    """Raise the row's token to ``floor``, the lowest its agent accepts, when it is below
    (the database went back); the token it had, or None when it was not below (a newer
    claim exists: the refusal stands) or when no row could ever have reached ``floor`` (an
    agent naming a number beyond every token handed out so far is not believed: a node
    cannot push a row's token to the column's end)."""
    before = conn.execute(select(table.c.fence_token).where(
        table.c.id == row_id).with_for_update()).scalar()
    if before is None or before >= floor or floor > first_token(conn) + (1 << EPOCH_BITS):
        return None
    conn.execute(update(table).where(table.c.id == row_id, table.c.fence_token < floor).values(
        fence_token=floor, updated_at=table.c.updated_at))
    return int(before)


def take_handle_tokens(conn: Connection, handle_ids: Sequence[int]) -> dict[int, int]:
    """The next token of each handle (in the caller's transaction): id -> token."""
    ids = sorted(set(handle_ids))
    if not ids:
        return {}
    conn.execute(update(attach_handles).where(attach_handles.c.id.in_(ids)).values(
        fence_token=attach_handles.c.fence_token + 1,
        updated_at=attach_handles.c.updated_at))  # bookkeeping: not a change of the handle
    return dict(conn.execute(select(attach_handles.c.id, attach_handles.c.fence_token).where(
        attach_handles.c.id.in_(ids))).tuples().all())


def take_deployable_token(conn: Connection, deployable_id: int) -> int:
    """The next token of the deployable (the caller holds its row lock)."""
    conn.execute(update(deployables).where(deployables.c.id == deployable_id).values(
        fence_token=deployables.c.fence_token + 1, updated_at=deployables.c.updated_at))
    return int(conn.execute(select(deployables.c.fence_token).where(
        deployables.c.id == deployable_id)).scalar_one())


def handle_token(conn: Connection, handle_id: int) -> int | None:
    """The handle's newest token (None: the handle is gone)."""
    return conn.execute(select(attach_handles.c.fence_token).where(
        attach_handles.c.id == handle_id)).scalar()


def deployable_token(conn: Connection, deployable_id: int) -> int | None:
    """The deployable's newest token (None: it is gone)."""
    return conn.execute(select(deployables.c.fence_token).where(
        deployables.c.id == deployable_id)).scalar()


def fence_untold(fence_token: int, fence_told: int | None) -> bool:
    """A bind of the deployable's handle with no host step must tell the agent its token:
    never told (a new row, whose first token refuses an earlier row's programs), or a
    program marked it since (that program may be stale). Otherwise the agent already refuses
    every program up to ``fence_token``."""
    return fence_told is None or fence_token > fence_told


def record_told(conn: Connection, deployable_id: int, told: int) -> None:
    """The agent durably refuses programs up to ``told`` (its fence answered): never lowered,
    so a slower bind that read an older token does not undo a newer one's record."""
    conn.execute(update(deployables).where(
        deployables.c.id == deployable_id,
        (deployables.c.fence_told.is_(None)) | (deployables.c.fence_told < told)).values(
        fence_told=told, updated_at=deployables.c.updated_at))
