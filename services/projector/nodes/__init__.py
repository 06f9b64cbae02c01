"""Nodes: the ``nodes`` table, the agent that keeps it, and its HTTP views."""
