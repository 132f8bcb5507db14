"""Anthropic's Messages API, ``POST /v1/messages``, over the chat completions machinery (as vLLM serves it):
clients written for Anthropic's API (the ``anthropic`` package, agents pointed at ``ANTHROPIC_BASE_URL``) talk
to pdserve unchanged.

The body is translated into a chat completions body (``to_chat.py``: ``system`` into a system message, content
blocks into messages, ``tool_use`` / ``tool_result`` blocks into calls and tool messages, tools and
``tool_choice``, ``thinking`` into the template's ``enable_thinking``) and runs as one chat request; its output,
split as chat splits it, is rendered as content blocks (``thinking``, ``text``, ``tool_use``), whole or as
Anthropic's stream events (``render.py``). Errors have Anthropic's shape (``{"type": "error", "error": {"type",
"message"}}``).
"""
