"""pdserve decode node."""
