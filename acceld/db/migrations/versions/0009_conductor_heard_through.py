"""conductors: how far each conductor has written the heartbeats it heard

Revision ID: 0009_conductor_heard_through
Revises: 0008_agent_discovery
Create Date: 2026-12-03
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0009_conductor_heard_through'
down_revision = '0008_agent_discovery'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('conductors', schema=None) as batch_op:
        batch_op.add_column(sa.Column('heard_through', TIMESTAMP, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('conductors', schema=None) as batch_op:
        batch_op.drop_column('heard_through')
