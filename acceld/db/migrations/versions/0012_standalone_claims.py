"""accelerator_requests.consumer_uuid and claim_consumers: standalone claims (API 2.8)

An ARQ claimed without Nova names the Placement consumer acceld allocates for it; each
such consumer has a row saying whose it is and whether its allocation must be written
again (a claim that failed, an ARQ released). Additive: no existing row changes, and no
table is rebuilt (a nullable column without a server default is a plain ALTER TABLE ADD
COLUMN on SQLite, run with foreign keys off by acceld.db.migrate like every migration).

Revision ID: 0012_standalone_claims
Revises: 0011_node_key_generations
Create Date: 2026-12-04
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0012_standalone_claims'
down_revision = '0011_node_key_generations'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('accelerator_requests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('consumer_uuid', sa.String(length=36), nullable=True))
        batch_op.create_index('ix_accelerator_requests_consumer_uuid', ['consumer_uuid'],
                              unique=False)
    op.create_table('claim_consumers',
    sa.Column('consumer_uuid', sa.String(length=36), nullable=False),
    sa.Column('project_id', sa.String(length=255), nullable=True),
    sa.Column('user_id', sa.String(length=255), nullable=True),
    sa.Column('due', sa.Boolean(), nullable=False),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', TIMESTAMP, nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', TIMESTAMP, nullable=False),
    sa.Column('updated_at', TIMESTAMP, nullable=True),
    sa.PrimaryKeyConstraint('consumer_uuid')
    )
    op.create_index('ix_claim_consumers_due_lease', 'claim_consumers',
                    ['due', 'lease_expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_claim_consumers_due_lease', table_name='claim_consumers')
    op.drop_table('claim_consumers')
    with op.batch_alter_table('accelerator_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_accelerator_requests_consumer_uuid')
        batch_op.drop_column('consumer_uuid')
