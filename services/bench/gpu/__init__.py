"""GPU benchmarks and the tools that build and ship what they need (``make bench-gpu``)."""
