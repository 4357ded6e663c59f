"""The bench's configuration layer, below everything that runs a bench (targets, locust, studies, sweep):
the typed config (schema.py, search_groups.py), its checks at the entry point (checks.py), the views of it
a run's parts share (views.py) and how a command ends on an error (errors.py). It imports none of the
layers above it (the ``loadgen-config`` contract in pyproject.toml)."""
