"""Rigs that run no agent server: their deployable rows as a first bind leaves them."""

from __future__ import annotations

from sqlalchemy import Connection, update

from acceld.db.models import deployables


def agent_told(conn: Connection) -> None:
    """Every deployable's token told to its agent (``deployables.fence_told``), as the first
    bind of a row new from discovery does through ``POST /deployables/fence``
    (docs/architecture.md, "Fencing"): a PCI bind is then one transaction with no agent
    call, which rigs without an agent server rely on. The fencing tests
    (tests/db/test_fencing.py's FencedNode) run the real agent and leave rows untold."""
    conn.execute(update(deployables).values(fence_told=deployables.c.fence_token))
