"""Run a whole pdserve cluster on loopback: ``python -m services.cluster`` (what ``make run`` starts)."""
