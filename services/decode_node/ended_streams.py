"""Token streams whose last event an ``Attach`` took, kept a while for a re-attach.

The call that took the last event may have broken before the event reached the gateway (the gateway
stood still, its connection was lost): the gateway attaches again with ``resume_after`` and must still find
the tail and the end. These streams are no running requests (the engine freed them; a drain or
``calls_in_flight`` does not count them); each is kept for ``keep_s``, at most ``max_streams`` of them (the
oldest go first), each at most its request's ``max_tokens`` token ids.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from services.decode_node.token_stream import TokenStream


class EndedStreams:
    def __init__(self, keep_s: float, max_streams: int = 4096) -> None:
        self.keep_s = keep_s
        self.max_streams = max_streams
        self._streams: OrderedDict[str, TokenStream] = OrderedDict()

    def __len__(self) -> int:
        return len(self._streams)

    def get(self, request_id: str) -> TokenStream | None:
        return self._streams.get(request_id)

    def keep(self, request_id: str, stream: TokenStream) -> None:
        """Keep ``stream`` for ``keep_s`` (on the running event loop)."""
        self._streams.pop(request_id, None)
        self._streams[request_id] = stream
        while len(self._streams) > self.max_streams:
            self._streams.popitem(last=False)
        asyncio.get_running_loop().call_later(self.keep_s, self._forget, request_id, stream)

    def _forget(self, request_id: str, stream: TokenStream) -> None:
        if self._streams.get(request_id) is stream:
            del self._streams[request_id]
