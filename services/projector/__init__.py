"""The projector: folds the event log into job and node read models and serves them.

``python -m services.projector`` runs the worker; ``services.projector.client``
queries it without importing faust.
"""
