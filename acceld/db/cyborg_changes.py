"""`acceld db cyborg-changes`: the ARQs acceld holds differently from upstream's database.

Going back to upstream Cyborg after an import (README, "Replacing a running upstream
Cyborg", step 7) starts upstream on its own database, which the import only read: every
ARQ there is as upstream last had it. What Nova did through acceld meanwhile (an ARQ
deleted with its instance, a new one bound, perhaps on the same attach handle) is then
wrong in upstream's view. This lists those ARQs by instance, so the operator knows which
servers to look at (rebuild, or delete their ARQs upstream). Upstream's database is only
read (:func:`acceld.db.cyborg_import.read_only_engine`).
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from acceld.db.cyborg_import import UP, read_only_engine, upstream_revision
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, attach_handles


@dataclasses.dataclass(frozen=True)
class Side:
    """One ARQ as one database holds it."""

    state: str
    instance: str | None
    handle: str | None  # the attach handle's uuid

    def text(self) -> str:
        return self.state + (f" on handle {self.handle}" if self.handle else "")


@dataclasses.dataclass(frozen=True)
class Change:
    """An ARQ the two databases hold differently (None: that one does not hold it)."""

    arq: str
    upstream: Side | None
    acceld: Side | None

    @property
    def instances(self) -> list[str]:
        found = {s.instance for s in (self.upstream, self.acceld) if s and s.instance}
        return sorted(found) or ["(none)"]


def _upstream(url: str) -> dict[str, Side]:
    arqs, handles = UP["extended_accelerator_requests"], UP["attach_handles"]
    engine = read_only_engine(url)
    try:
        with engine.connect() as conn:
            upstream_revision(conn)
            rows = conn.execute(select(arqs.c.uuid, arqs.c.state, arqs.c.instance_uuid,
                                       handles.c.uuid.label("handle")).outerjoin(
                handles, handles.c.id == arqs.c.attach_handle_id)).all()
            conn.rollback()
    finally:
        engine.dispose()
    return {r.uuid: Side(r.state, r.instance_uuid, r.handle) for r in rows}


def _acceld(db: Database) -> dict[str, Side]:
    arqs = accelerator_requests
    with db.read() as conn:
        rows = conn.execute(select(arqs.c.uuid, arqs.c.state, arqs.c.instance_uuid,
                                   attach_handles.c.uuid.label("handle")).outerjoin(
            attach_handles, attach_handles.c.id == arqs.c.attach_handle_id)).all()
    return {r.uuid: Side(r.state, r.instance_uuid, r.handle) for r in rows}


def changes(url: str, db: Database) -> list[Change]:
    """Every ARQ whose state, instance or attach handle differs, in uuid order.
    Raises ImportRefused when ``url`` is not an upstream Cyborg 17 database."""
    up, ours = _upstream(url), _acceld(db)
    return [Change(arq, up.get(arq), ours.get(arq)) for arq in sorted(set(up) | set(ours))
            if up.get(arq) != ours.get(arq)]


def report(found: list[Change]) -> list[str]:
    """The command's lines: one per instance and ARQ, instances in order."""
    if not found:
        return ["no accelerator request differs from upstream's database: going back "
                "shows Nova's instances as acceld has them"]
    lines = [f"{len(found)} accelerator request(s) differ from upstream's database; going "
             "back, upstream shows each as its 'upstream' side:"]
    rows = sorted(((instance, c) for c in found for instance in c.instances),
                  key=lambda row: (row[0], row[1].arq))
    for instance, c in rows:
        up = c.upstream.text() if c.upstream else ": none"
        ours = c.acceld.text() if c.acceld else "deleted"
        lines.append(f"  instance {instance}: ARQ {c.arq} upstream{' ' if c.upstream else ''}"
                     f"{up}; in acceld: {ours}")
    return lines
