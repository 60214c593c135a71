"""Raises SystemExit while it is imported: must be rejected without taking down whoever checks it."""

raise SystemExit(3)
