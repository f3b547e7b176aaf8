"""deployables: who is programming the device now, and until when that holds

Revision ID: 0004_deployable_programming_hold
Revises: 0003_deployable_program_status
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0004_deployable_programming_hold'
down_revision = '0003_deployable_program_status'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.add_column(sa.Column('programming_owner', sa.String(length=64),
                                      nullable=True))
        batch_op.add_column(sa.Column('programming_until', TIMESTAMP, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.drop_column('programming_until')
        batch_op.drop_column('programming_owner')
