"""The gateway's node channels follow a rotated certificate: new calls present the new one."""

from __future__ import annotations

import asyncio

import pytest

from services.common.tls import identity as identity_module
from services.common.tls.ca import ClusterCA
from services.common.tls.channels import current_identity, set_identity
from services.common.tls.identity import Identity
from services.gateway.directory import NodeDirectory
from services.gateway.nodes import DECODE
from tests.tls_identities import session_root


@pytest.fixture
def own_identity(tmp_path, monkeypatch):
    """This process as a gateway with a certificate in a directory of its own (restored afterwards)."""
    monkeypatch.setattr(identity_module, "RECHECK_S", 0.0)
    ca = ClusterCA.load(session_root() / "ca")
    ca.issue(tmp_path / "gw", ("gateway",))
    previous = current_identity()
    set_identity(Identity(tmp_path / "gw"))
    yield ca, tmp_path / "gw"
    set_identity(previous)


def test_a_rotated_certificate_reopens_the_channels(own_identity):
    ca, directory_path = own_identity

    async def run() -> None:
        directory = NodeDirectory([("127.0.0.1:1", DECODE)])
        first = directory.stub("127.0.0.1:1")
        assert directory.stub("127.0.0.1:1") is first  # unchanged files: the same channel
        old_channel = directory._channels["127.0.0.1:1"]
        ca.issue(directory_path, ("gateway",))  # rotation: new key and certificate, same place
        second = directory.stub("127.0.0.1:1")
        assert second is not first
        assert directory._channels["127.0.0.1:1"] is not old_channel
        await directory.close()

    asyncio.run(run())
