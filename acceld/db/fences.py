"""Fencing tokens: taken from the database with each claim that authorises an agent call.

``attach_handles.fence_token`` grows by one with each claim that may make an agent change
the handle on its host (a release claim, a bind's prepare step); ``deployables.fence_token``
with each programming mark. The token is taken in the claim's own transaction, so that a
later claim always holds a larger token than every earlier one, and the agent refuses a
token older than the newest it has seen (acceld.agent.fences; docs/architecture.md,
"Fencing"). The increment is one UPDATE of a row the claim writes or locks anyway.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import Connection, select, update

from acceld.db.models import attach_handles, deployables


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
