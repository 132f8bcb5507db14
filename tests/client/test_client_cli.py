"""``python -m services.client``: arguments it cannot send are argparse errors (exit 2, a message naming
the flag), not tracebacks; good ones build the request as given."""

from __future__ import annotations

import pytest

from services.client.__main__ import build_request, parse_args


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-tokens", "-5", "must be in [1, 4294967295], got -5"),
    ("--max-tokens", "0", "must be in [1, "),
    ("--max-tokens", str(2**32), "must be in [1, 4294967295], got 4294967296"),
    ("--seed", "-1", "must be in [0, 18446744073709551615]"),
    ("--seed", "9" * 23, f"must be in [0, {2**64 - 1}], got {'9' * 23}"),  # was a ValueError traceback
    ("--timeout", "0", "must be > 0 seconds, got 0"),
    ("--timeout", "-1", "must be > 0 seconds")])
def test_values_out_of_range_are_usage_errors_naming_the_flag(capsys, flag, value, message):
    with pytest.raises(SystemExit) as exited:
        parse_args(["hi", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_a_chat_request_with_a_seed():
    request = build_request(parse_args(["hi", "--chat", "--seed", "0", "--max-tokens", "3"]))
    assert [(m.role, m.content) for m in request.messages] == [("user", "hi")]
    assert (request.sampling.max_tokens, request.sampling.seed) == (3, 0) and request.sampling.HasField("seed")
