"""conductors: the live conductors sharing the database (membership of the hash ring)

Revision ID: 0007_conductors
Revises: 0006_bind_job_request_id
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0007_conductors'
down_revision = '0006_bind_job_request_id'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    op.create_table(
        'conductors',
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('url', sa.String(length=255), nullable=True),
        sa.Column('started_at', TIMESTAMP, nullable=False),
        sa.Column('heartbeat_at', TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )


def downgrade() -> None:
    op.drop_table('conductors')
