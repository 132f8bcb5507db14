"""Transport security: the cluster CA (``ca``), a process's certificate (``identity``), the process-wide
identity and its channels (``channels``), caller roles checked per RPC (``roles``). See DESIGN.md and
docs/security.md."""
