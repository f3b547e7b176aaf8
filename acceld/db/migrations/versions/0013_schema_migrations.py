"""schema_migrations: each applied migration and its phase (expand or contract)

A service reads it at start to tell a schema a newer release only expanded, which it may
run on during a rolling upgrade, from one it contracted (docs/upgrades.md). Rows for the
migrations before this one are written here; later ones are written as each is applied
(acceld/db/migrations/env.py).

Revision ID: 0013_schema_migrations
Revises: 0012_standalone_claims
Create Date: 2026-12-04
"""
import datetime as dt

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0013_schema_migrations'
down_revision = '0012_standalone_claims'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'

EARLIER = ['0001', '0002_internal_nonces', '0003_deployable_program_status',
           '0004_deployable_programming_hold', '0005_device_health',
           '0006_bind_job_request_id', '0007_conductors', '0008_agent_discovery',
           '0009_conductor_heard_through', '0010_fencing_tokens',
           '0011_node_key_generations', '0012_standalone_claims']


def upgrade() -> None:
    table = op.create_table('schema_migrations',
    sa.Column('revision', sa.String(length=64), nullable=False),
    sa.Column('phase', sa.String(length=8), nullable=False),
    sa.Column('applied_at', TIMESTAMP, nullable=False),
    sa.PrimaryKeyConstraint('revision')
    )
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    op.bulk_insert(table, [{'revision': rev, 'phase': 'expand', 'applied_at': now}
                           for rev in EARLIER])


def downgrade() -> None:
    op.drop_table('schema_migrations')
