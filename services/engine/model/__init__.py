"""The decoder of every supported family (``decoder``), its configuration (``config``) and the registry of
families (``registry``). The package itself imports nothing: its configuration half is torch-free, and the
gateway reads it without loading torch."""
