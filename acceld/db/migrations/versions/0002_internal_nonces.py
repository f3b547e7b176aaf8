"""internal_nonces: the conductors' shared replay cache of internal credentials

Revision ID: 0002_internal_nonces
Revises: 0001
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0002_internal_nonces'
down_revision = '0001'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    op.create_table('internal_nonces',
    sa.Column('nonce', sa.String(length=64), nullable=False),
    sa.Column('expires_at', TIMESTAMP, nullable=False),
    sa.PrimaryKeyConstraint('nonce')
    )
    with op.batch_alter_table('internal_nonces', schema=None) as batch_op:
        batch_op.create_index('ix_internal_nonces_expires_at', ['expires_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('internal_nonces', schema=None) as batch_op:
        batch_op.drop_index('ix_internal_nonces_expires_at')
    op.drop_table('internal_nonces')
