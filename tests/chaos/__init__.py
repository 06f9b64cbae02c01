"""The chaos and fuzz suite (``make chaos``): a whole stack under kills, fuzzing and poison.

``python -m tests.chaos --help`` for its settings; ``tests/chaos/run.py`` for the phases.
"""
