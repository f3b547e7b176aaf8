"""Placement: the inventory mirror (sync) and its read-back repair (audit), a bind's checks
against Placement (checks) and standalone claims' allocations (claim_allocations)."""
