"""node_key_generations: each rotated or revoked node key's current generation

A node without a row keeps generation 0, the key of earlier releases, so the upgrade
changes no node's key (docs/security.md, "Revoking a node's key").

Revision ID: 0011_node_key_generations
Revises: 0010_fencing_tokens
Create Date: 2026-12-04
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

revision = '0011_node_key_generations'
down_revision = '0010_fencing_tokens'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    op.create_table('node_key_generations',
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.Column('changed_at', TIMESTAMP, nullable=False),
    sa.PrimaryKeyConstraint('hostname')
    )


def downgrade() -> None:
    op.drop_table('node_key_generations')
