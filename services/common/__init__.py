"""What every pdserve service shares: server bootstrap, config, logging, errors → status codes."""
