"""Compute kernels: attention backends (``kernels.attention``), rotary embedding, RMS norm, fused elementwise ops."""
