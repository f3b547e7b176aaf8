"""attach_handles, deployables: fencing tokens for side effects made outside the database

A conductor takes the next token with its claim (a handle's release or preparation, a
deployable's program) and the agent refuses a token older than the newest it has seen for
that handle or deployable, so a conductor that stalled past its claim does nothing when it
resumes (docs/architecture.md, "Fencing").

Revision ID: 0010_fencing_tokens
Revises: 0009_conductor_heard_through
Create Date: 2026-12-04
"""
from alembic import op
import sqlalchemy as sa

revision = '0010_fencing_tokens'
down_revision = '0009_conductor_heard_through'
branch_labels = None
depends_on = None
# Safe while the previous release runs (only adds): docs/upgrades.md, "Expand and contract".
phase = 'expand'


def upgrade() -> None:
    # Plain ADD COLUMN on every backend (no batch rebuild: see 0005's note on SQLite).
    op.add_column('attach_handles', sa.Column('fence_token', sa.BigInteger(),
                                              nullable=False, server_default='0'))
    op.add_column('deployables', sa.Column('fence_token', sa.BigInteger(),
                                           nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('deployables', schema=None) as batch_op:
        batch_op.drop_column('fence_token')
    with op.batch_alter_table('attach_handles', schema=None) as batch_op:
        batch_op.drop_column('fence_token')
