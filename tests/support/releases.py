"""A later release's migrations, for tests of the expand/contract phases: a copy of this
release's migration directory with extra revisions appended, which ``acceld.db.migrate``
uses while :func:`later_release` is active (its MIGRATIONS_DIR)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

from acceld.db import migrate

TEMPLATE = '''"""{doc}

Revision ID: {revision}
Revises: {down}
"""
from alembic import op
import sqlalchemy as sa

revision = {revision!r}
down_revision = {down!r}
branch_labels = None
depends_on = None
phase = {phase!r}


def upgrade() -> None:
{body}


def downgrade() -> None:
    pass
'''

# What a later release might do in each phase: add a table and a nullable column (expand),
# drop a column the earlier release reads (contract).
EXPAND_WIDGETS = ("expand", "widgets table and a nullable column",
                  "    op.create_table('widgets', sa.Column('id', sa.Integer(), "
                  "primary_key=True))\n"
                  "    op.add_column('agents', sa.Column('widget_note', sa.String(32), "
                  "nullable=True))")
CONTRACT_DROP = ("contract", "drop agents.widget_note",
                 "    with op.batch_alter_table('agents') as batch_op:\n"
                 "        batch_op.drop_column('widget_note')")
EXPAND_INDEX = ("expand", "an index on widgets",
                "    op.create_index('ix_widgets_id', 'widgets', ['id'])")


def write_release(root: Path, steps: list[tuple[str, str, str]]) -> Path:
    """A migrations directory: this release's plus ``steps`` (phase, doc, body) as
    revisions 9001, 9002, ... in that order; returns it."""
    target = root / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, target,
                    ignore=shutil.ignore_patterns("__pycache__"))
    down = migrate.head_revision()
    for number, (phase, doc, body) in enumerate(steps, start=9001):
        revision = f"{number}_{phase}"
        (target / "versions" / f"{revision}.py").write_text(TEMPLATE.format(
            doc=doc, revision=revision, down=down, phase=phase, body=body))
        down = revision
    return target


@contextlib.contextmanager
def later_release(directory: Path) -> Iterator[None]:
    """Run acceld.db.migrate with ``directory``'s migrations (the later release's code)."""
    saved = migrate.MIGRATIONS_DIR
    migrate.MIGRATIONS_DIR = str(directory)
    try:
        yield
    finally:
        migrate.MIGRATIONS_DIR = saved
