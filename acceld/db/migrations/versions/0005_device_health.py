"""devices: health, quarantine and hysteresis; device_events: each device's history

Revision ID: 0005_device_health
Revises: 0004_deployable_programming_hold
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0005_device_health'
down_revision = '0004_deployable_programming_hold'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    # On SQLite the Boolean server default makes this batch a table rebuild (copy, DROP
    # TABLE, rename). With foreign keys on, the DROP cascaded into every control path,
    # deployable, attribute, attach handle and queued release, and cleared the Bound ARQs'
    # handles (issue 24); acceld.db.migrate.upgrade now runs migrations with them off and
    # checks them before the commit (acceld-status upgrade check finds a damaged database).
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.add_column(sa.Column('health', sa.String(length=16), nullable=False,
                                      server_default='unknown'))
        batch_op.add_column(sa.Column('health_reason', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('health_since', TIMESTAMP, nullable=True))
        batch_op.add_column(sa.Column('health_ok_reports', sa.Integer(), nullable=False,
                                      server_default='0'))
        batch_op.add_column(sa.Column('quarantined', sa.Boolean(), nullable=False,
                                      server_default=sa.false()))
        batch_op.add_column(sa.Column('quarantined_at', TIMESTAMP, nullable=True))
        batch_op.create_index('ix_devices_health', ['health'], unique=False)
    op.create_table(
        'device_events',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('uuid', sa.String(length=36), nullable=False),
        sa.Column('device_uuid', sa.String(length=36), nullable=False),
        sa.Column('hostname', sa.String(length=255), nullable=True),
        sa.Column('created_at', TIMESTAMP, nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('detail', sa.Text(), nullable=True),
        sa.Column('actor', sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('uuid'),
    )
    op.create_index('ix_device_events_device_uuid_id', 'device_events',
                    ['device_uuid', 'id'], unique=False)
    op.create_index('ix_device_events_created_at', 'device_events', ['created_at'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_device_events_created_at', table_name='device_events')
    op.drop_index('ix_device_events_device_uuid_id', table_name='device_events')
    op.drop_table('device_events')
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.drop_index('ix_devices_health')
        batch_op.drop_column('quarantined_at')
        batch_op.drop_column('quarantined')
        batch_op.drop_column('health_ok_reports')
        batch_op.drop_column('health_since')
        batch_op.drop_column('health_reason')
        batch_op.drop_column('health')
