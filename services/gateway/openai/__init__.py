"""The gateway's OpenAI-compatible HTTP front: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
``/v1/responses``, and Anthropic's ``/v1/messages``.

A FastAPI app served by uvicorn inside the gateway's own event loop, next to its gRPC server. Each request
is translated to a ``GenerateInput`` and run by the same ``GatewayCore`` as a gRPC ``Generate`` call (same
validation, routing, metrics, tracing and cancellation), and its ``GenerateChunk``s are translated back:
a JSON body, or server-sent events when ``stream`` is true. Errors have OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (Anthropic's on ``/v1/messages``) and an HTTP status that
says what went wrong.

Modules: ``schemas`` (request bodies), ``responses`` (response bodies), ``translate`` (requests →
``GenerateInput``, chunks → response bodies), ``chat_request`` (a chat body as it runs), ``errors`` (error
shapes and status mapping), ``body_limit`` (request size cap), ``auth`` (API keys), ``request_ids`` (ids and
``X-Request-Id``), ``streaming`` (running a flow: SSE or one body; disconnects cancel), ``event_stream`` (the
same for an event state machine), ``responses_api`` and ``messages_api`` (OpenAI's Responses and Anthropic's
Messages APIs over chat), ``app`` (routes), ``server`` (uvicorn in the running loop, drain).
"""
