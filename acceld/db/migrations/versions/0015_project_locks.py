"""project_locks: one row per project, updated first in each limited create's transaction

A row lock that MariaDB Galera certifies: two creates for one project on two nodes both
write the row, so one of them is rolled back at commit (error 1213) and runs again,
where ``GET_LOCK`` (the MariaDB lock before this) is not replicated at all
(acceld.db.project_lock). Only adds a table.

Revision ID: 0015_project_locks
Revises: 0014_placement_ownership
Create Date: 2026-12-06
"""
from alembic import op
import sqlalchemy as sa

revision = '0015_project_locks'
down_revision = '0014_placement_ownership'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    op.create_table('project_locks',
    sa.Column('project_id', sa.String(length=255), nullable=False),
    sa.Column('writes', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('project_id')
    )


def downgrade() -> None:
    op.drop_table('project_locks')
