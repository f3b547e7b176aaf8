"""An example out-of-tree acceld driver (see docs/driver-guide.md)."""
