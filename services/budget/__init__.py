"""Budget: the budget tree and the usage ledger, both folded from the event log."""
