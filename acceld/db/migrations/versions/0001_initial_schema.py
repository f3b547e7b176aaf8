"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

# Microsecond timestamps (MySQL/MariaDB default to whole seconds).
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    op.create_table('agents',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('endpoint', sa.String(length=255), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False),
    sa.Column('hardware_digest', sa.String(length=64), nullable=True),
    sa.Column('heartbeat_interval', sa.Integer(), nullable=False),
    sa.Column('last_seen_at', TIMESTAMP, nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('hostname')
    )
    op.create_table('device_profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('profile_json', sa.Text(), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name'),
    sa.UniqueConstraint('uuid')
    )
    op.create_table('devices',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('type', sa.String(length=30), nullable=False),
    sa.Column('vendor', sa.String(length=255), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('std_board_info', sa.Text(), nullable=True),
    sa.Column('vendor_board_info', sa.Text(), nullable=True),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('status_reason', sa.Text(), nullable=True),
    sa.Column('acc_status', sa.String(length=32), nullable=False),
    sa.Column('vanished', sa.Boolean(), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.create_index('ix_devices_hostname', ['hostname'], unique=False)
        batch_op.create_index('ix_devices_type', ['type'], unique=False)
        batch_op.create_index('ix_devices_vendor', ['vendor'], unique=False)

    op.create_table('leases',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('owner', sa.String(length=64), nullable=False),
    sa.Column('expires_at', TIMESTAMP, nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('placement_sync',
    sa.Column('rp_uuid', sa.String(length=36), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=True),
    sa.Column('dirty', sa.Boolean(), nullable=False),
    sa.Column('generation', sa.BigInteger(), nullable=True),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.PrimaryKeyConstraint('rp_uuid')
    )
    op.create_table('controlpath_ids',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('cpid_type', sa.String(length=16), nullable=False),
    sa.Column('cpid_info', sa.String(length=255), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('controlpath_ids', schema=None) as batch_op:
        batch_op.create_index('ix_controlpath_ids_device_id', ['device_id'], unique=False)
        batch_op.create_index('ix_controlpath_ids_info', ['cpid_info'], unique=False)

    op.create_table('deployables',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=True),
    sa.Column('root_id', sa.Integer(), nullable=True),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('num_accelerators', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('driver_name', sa.String(length=100), nullable=True),
    sa.Column('rp_uuid', sa.String(length=36), nullable=True),
    sa.Column('bitstream_id', sa.String(length=36), nullable=True),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['parent_id'], ['deployables.id'], ),
    sa.ForeignKeyConstraint(['root_id'], ['deployables.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.create_index('ix_deployables_device_id', ['device_id'], unique=False)
        batch_op.create_index('ix_deployables_rp_uuid', ['rp_uuid'], unique=False)

    op.create_table('attach_handles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('deployable_id', sa.Integer(), nullable=False),
    sa.Column('cpid_id', sa.Integer(), nullable=True),
    sa.Column('attach_type', sa.String(length=16), nullable=False),
    sa.Column('attach_info', sa.String(length=255), nullable=False),
    sa.Column('in_use', sa.Boolean(), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['cpid_id'], ['controlpath_ids.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['deployable_id'], ['deployables.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('attach_handles', schema=None) as batch_op:
        batch_op.create_index('ix_attach_handles_deployable_id_in_use', ['deployable_id', 'in_use'], unique=False)

    op.create_table('attributes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('deployable_id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('value', sa.String(length=255), nullable=False),
    sa.Column('operator_owned', sa.Boolean(), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['deployable_id'], ['deployables.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('deployable_id', 'key', name='uq_attributes_deployable_id_key'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('attributes', schema=None) as batch_op:
        batch_op.create_index('ix_attributes_key', ['key'], unique=False)

    op.create_table('accelerator_requests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=36), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('device_profile_id', sa.Integer(), nullable=False),
    sa.Column('device_profile_group_id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.String(length=255), nullable=True),
    sa.Column('hostname', sa.String(length=255), nullable=True),
    sa.Column('device_rp_uuid', sa.String(length=36), nullable=True),
    sa.Column('instance_uuid', sa.String(length=36), nullable=True),
    sa.Column('attach_handle_id', sa.Integer(), nullable=True),
    sa.Column('deployable_id', sa.Integer(), nullable=True),
    sa.Column('bind_failure_reason', sa.Text(), nullable=True),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['attach_handle_id'], ['attach_handles.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['deployable_id'], ['deployables.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['device_profile_id'], ['device_profiles.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('accelerator_requests', schema=None) as batch_op:
        batch_op.create_index('ix_accelerator_requests_attach_handle_id', ['attach_handle_id'], unique=False)
        batch_op.create_index('ix_accelerator_requests_device_profile_id', ['device_profile_id'], unique=False)
        batch_op.create_index('ix_accelerator_requests_instance_uuid', ['instance_uuid'], unique=False)
        batch_op.create_index('ix_accelerator_requests_project_id', ['project_id'], unique=False)

    op.create_table('bind_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('arq_id', sa.Integer(), nullable=False),
    sa.Column('instance_uuid', sa.String(length=36), nullable=True),
    sa.Column('phase', sa.String(length=16), nullable=False),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', TIMESTAMP, nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['arq_id'], ['accelerator_requests.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('arq_id')
    )
    with op.batch_alter_table('bind_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_bind_jobs_phase_lease', ['phase', 'lease_expires_at'], unique=False)

    op.create_table('handle_releases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('attach_handle_id', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('driver_name', sa.String(length=100), nullable=True),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', TIMESTAMP, nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.ForeignKeyConstraint(['attach_handle_id'], ['attach_handles.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('attach_handle_id')
    )
    with op.batch_alter_table('handle_releases', schema=None) as batch_op:
        batch_op.create_index('ix_handle_releases_lease', ['lease_expires_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('handle_releases', schema=None) as batch_op:
        batch_op.drop_index('ix_handle_releases_lease')

    op.drop_table('handle_releases')
    with op.batch_alter_table('bind_jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_bind_jobs_phase_lease')

    op.drop_table('bind_jobs')
    with op.batch_alter_table('accelerator_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_accelerator_requests_project_id')
        batch_op.drop_index('ix_accelerator_requests_instance_uuid')
        batch_op.drop_index('ix_accelerator_requests_device_profile_id')
        batch_op.drop_index('ix_accelerator_requests_attach_handle_id')

    op.drop_table('accelerator_requests')
    with op.batch_alter_table('attributes', schema=None) as batch_op:
        batch_op.drop_index('ix_attributes_key')

    op.drop_table('attributes')
    with op.batch_alter_table('attach_handles', schema=None) as batch_op:
        batch_op.drop_index('ix_attach_handles_deployable_id_in_use')

    op.drop_table('attach_handles')
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.drop_index('ix_deployables_rp_uuid')
        batch_op.drop_index('ix_deployables_device_id')

    op.drop_table('deployables')
    with op.batch_alter_table('controlpath_ids', schema=None) as batch_op:
        batch_op.drop_index('ix_controlpath_ids_info')
        batch_op.drop_index('ix_controlpath_ids_device_id')

    op.drop_table('controlpath_ids')
    op.drop_table('placement_sync')
    op.drop_table('leases')
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.drop_index('ix_devices_vendor')
        batch_op.drop_index('ix_devices_type')
        batch_op.drop_index('ix_devices_hostname')

    op.drop_table('devices')
    op.drop_table('device_profiles')
    op.drop_table('agents')
