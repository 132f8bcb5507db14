"""Constrained decoding with llguidance: ``compiler.py`` (spec → cached grammar; the ``check`` every layer
calls), ``matcher.py`` (a request's grammar state, rebuilt from its tokens), ``masking.py`` (a step's token
masks, filled while the forward runs). The spec itself is ``services/engine/structured_spec.py``."""
