"""A small command-line client of the gateway (``python -m services.client "prompt"``)."""
