"""Native (C) CPU kernels for attention, compiled on first use by ``build.load_library``."""
