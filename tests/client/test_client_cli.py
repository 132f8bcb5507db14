"""``python -m services.client``: arguments it cannot send are argparse errors (exit 2, a message naming
the flag), not tracebacks; good ones build the request as given."""

from __future__ import annotations

import pytest

from services.client.__main__ import build_request, parse_args


@pytest.mark.parametrize(("flag", "value", "minimum"), [("--max-tokens", "-5", 1), ("--max-tokens", "0", 1),
                                                         ("--seed", "-1", 0)])
def test_values_out_of_range_are_usage_errors_naming_the_flag(capsys, flag, value, minimum):
    with pytest.raises(SystemExit) as exited:
        parse_args(["hi", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: must be at least {minimum}, got {value}" in capsys.readouterr().err


def test_a_chat_request_with_a_seed():
    request = build_request(parse_args(["hi", "--chat", "--seed", "0", "--max-tokens", "3"]))
    assert [(m.role, m.content) for m in request.messages] == [("user", "hi")]
    assert (request.sampling.max_tokens, request.sampling.seed) == (3, 0) and request.sampling.HasField("seed")
