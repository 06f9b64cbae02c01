"""Jobs: the ``jobs`` table, the agent that keeps it, and its HTTP views."""
