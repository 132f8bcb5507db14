"""pdserve prefill node."""
