"""Placement: the scheduler service. Folds its ordered input into the core, emits decisions."""
