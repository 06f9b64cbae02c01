"""What Quartermaster reads from files and the environment, declared as pydantic models.

One module per kind of file (``budget``, ``policy``, ``scenario``, ``topics``,
``inventory``, ``workflow``) and ``env`` for settings; ``document`` reads and validates,
and every mistake is a ``ConfigError`` naming the file or variable, the key path and what
is expected. The models validate values only; each loader returns the plain values its
owner uses (the core's ``BudgetTree`` and ``PolicyConfig``, the simulator's ``Scenario``).
"""
