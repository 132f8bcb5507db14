"""OpenAI's Responses API, ``POST /v1/responses``, over the chat completions machinery.

A Responses body is translated into a chat completions body (``to_chat.py``: ``input`` items into messages,
``instructions`` into a system message, function tools, ``text.format`` into ``response_format``) and runs as
one chat request; its output, split into reasoning, text and calls as chat splits it, is rendered as
Responses' output items (``objects.py``), whole or as Responses' typed server-sent events (``render.py``).
Nothing is stored: every response says ``store: false``, and ``previous_response_id`` is refused (send the
conversation in ``input``, as clients do with ``store: false``).
"""
