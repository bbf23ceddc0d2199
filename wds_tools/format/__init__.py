"""The on-disk format: the only code that knows the bytes docs/FORMAT.md describes."""
