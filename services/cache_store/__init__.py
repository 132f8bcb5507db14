"""The cache-store service: a content-addressed KV block pool shared by the cluster."""
