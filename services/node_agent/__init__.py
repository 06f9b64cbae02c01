"""The node agent: registers nodes, runs the tasks placed on them, reports their lifecycle
and when their GPUs go idle. Its modules are imported one by one (``python -m
services.node_agent``): a task's keeper (``keeper.py``) imports only what it needs."""
