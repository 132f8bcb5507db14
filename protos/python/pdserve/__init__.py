"""Generated gRPC stubs of the pdserve API (package ``pdserve-client``)."""
