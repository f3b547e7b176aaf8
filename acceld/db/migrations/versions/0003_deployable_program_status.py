"""deployables: the last API program's status, reason, request id and start time

Revision ID: 0003_deployable_program_status
Revises: 0002_internal_nonces
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0003_deployable_program_status'
down_revision = '0002_internal_nonces'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.add_column(sa.Column('program_status', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('program_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('program_request_id', sa.String(length=36),
                                      nullable=True))
        batch_op.add_column(sa.Column('program_started_at', TIMESTAMP, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.drop_column('program_started_at')
        batch_op.drop_column('program_request_id')
        batch_op.drop_column('program_reason')
        batch_op.drop_column('program_status')
