"""The node-side half that the prefill and decode nodes share: the engine worker thread, engine settings,
status and metrics, KV layout on the wire, request spans."""
