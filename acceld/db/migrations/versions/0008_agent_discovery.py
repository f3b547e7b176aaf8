"""agents: the last discovery of the node's agent that counted as a health report

Revision ID: 0008_agent_discovery
Revises: 0007_conductors
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0008_agent_discovery'
down_revision = '0007_conductors'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_discovery', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_column('last_discovery')
