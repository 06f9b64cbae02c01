"""The console: a read-only web view of the cluster, behind the CLI's tokens (``python -m
services.console``). See ``services.console.web_app`` for its routes."""
