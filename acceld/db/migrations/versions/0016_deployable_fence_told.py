"""deployables.fence_told: the token a bind last told the row's agent (issue 37 item 8)

A bind of a deployable's handle with no host step tells the agent the deployable's token
(``POST /deployables/fence``) when the agent has not been told it yet: NULL (never told: a
new row, whose first token must refuse every program of an earlier row of the same device
after its host was re-registered) or below ``fence_token`` (a program marked it since).
Additive: existing rows read NULL, so the first bind of each after the upgrade tells the
agent once; no row changes and no table is rebuilt.

Revision ID: 0016_deployable_fence_told
Revises: 0015_project_locks
Create Date: 2026-12-06
"""
from alembic import op
import sqlalchemy as sa

revision = '0016_deployable_fence_told'
down_revision = '0015_project_locks'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.add_column(sa.Column('fence_told', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.drop_column('fence_told')
