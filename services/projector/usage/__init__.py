"""Usage: the in-memory usage ledger, the reader that keeps it, snapshots and the view."""
