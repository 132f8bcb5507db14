"""The gateway carries every field a node reports: ``NodeInfo`` (``services.gateway.nodes``) holds each of
``pdserve.v1.NodeStatus``'s besides the address, role and error it sets itself, so ``ClusterStatus`` forwards them
all (a field missing there reads 0 through the gateway, as ``state_bytes_total`` did)."""

from __future__ import annotations

from pdserve.v1 import gateway_pb2

from services.gateway.nodes import STATUS_FIELDS


def test_every_node_status_field_is_carried_by_the_gateway():
    reported = {field.name for field in gateway_pb2.NodeStatus.DESCRIPTOR.fields}
    assert reported - set(STATUS_FIELDS) == {"address", "role", "error"}
    assert set(STATUS_FIELDS) <= reported
