"""The gateway's node channels follow a rotated certificate: new calls present the new one."""

from __future__ import annotations

import asyncio

from services.common.tls import identity as identity_module
from services.gateway.directory import NodeDirectory
from services.gateway.nodes import DECODE
from tests.tls_identities import own_rotatable_identity


def test_a_rotated_certificate_reopens_the_channels(tmp_path, monkeypatch):
    monkeypatch.setattr(identity_module, "RECHECK_S", 0.0)

    async def run() -> None:
        directory = NodeDirectory([("127.0.0.1:1", DECODE)])
        first = directory.stub("127.0.0.1:1")
        assert directory.stub("127.0.0.1:1") is first  # unchanged files: the same channel
        old_channel = directory._channels["127.0.0.1:1"]
        ca.issue(holder, ("gateway",))  # rotation: new key and certificate, same place
        second = directory.stub("127.0.0.1:1")
        assert second is not first
        assert directory._channels["127.0.0.1:1"] is not old_channel
        await directory.close()

    with own_rotatable_identity(tmp_path / "gw", "gateway") as (ca, holder):
        asyncio.run(run())
