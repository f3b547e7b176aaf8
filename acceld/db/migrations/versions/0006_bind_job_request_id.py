"""bind_jobs: the global request id of the API call that started the bind

Revision ID: 0006_bind_job_request_id
Revises: 0005_device_health
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0006_bind_job_request_id'
down_revision = '0005_device_health'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('bind_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('global_request_id', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('bind_jobs', schema=None) as batch_op:
        batch_op.drop_column('global_request_id')
