"""The gateway service: the cluster's public API (``pdserve.v1.Gateway``)."""
