"""placement_sync.reserved, operator_reserved, traits: what acceld owns on a provider

The Placement sync and audit keep what an operator set on a provider acceld manages (a
``reserved`` beyond acceld's own, traits acceld did not write) and tell it from what
acceld wrote by these columns (acceld.conductor.placement.ownership). Additive: no row
changes, existing rows read NULL (never written by this version) and no table is rebuilt.

Revision ID: 0014_placement_ownership
Revises: 0013_schema_migrations
Create Date: 2026-12-06
"""
from alembic import op
import sqlalchemy as sa

revision = '0014_placement_ownership'
down_revision = '0013_schema_migrations'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    with op.batch_alter_table('placement_sync', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reserved', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('operator_reserved', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('traits', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('placement_sync', schema=None) as batch_op:
        batch_op.drop_column('traits')
        batch_op.drop_column('operator_reserved')
        batch_op.drop_column('reserved')
