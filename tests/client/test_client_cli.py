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
    ("--timeout", "-1", "must be > 0 seconds"),
    ("--top-k", "-2", "must be in [-1, 2147483647], got -2"),
    ("--min-tokens", "-1", "must be in [0, 4294967295]")])
def test_values_out_of_range_are_usage_errors_naming_the_flag(capsys, flag, value, message):
    with pytest.raises(SystemExit) as exited:
        parse_args(["hi", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_a_chat_request_with_a_seed():
    request = build_request(parse_args(["hi", "--chat", "--seed", "0", "--max-tokens", "3"]))
    assert [(m.role, m.content) for m in request.messages] == [("user", "hi")]
    assert (request.sampling.max_tokens, request.sampling.seed) == (3, 0) and request.sampling.HasField("seed")


def test_sampling_flags_reach_the_request_and_unset_ones_stay_unset():
    request = build_request(parse_args(["hi", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "40",
                                        "--min-p", "0.05", "--presence-penalty", "0.5", "--frequency-penalty",
                                        "-0.25", "--repetition-penalty", "1.2", "--stop", "\n\n", "--stop", "END",
                                        "--min-tokens", "2", "--ignore-eos"]))
    sampling = request.sampling
    assert (sampling.top_k, sampling.min_tokens, sampling.ignore_eos) == (40, 2, True)
    assert list(sampling.stop) == ["\n\n", "END"]
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.25)
    assert sampling.top_p == pytest.approx(0.9) and sampling.min_p == pytest.approx(0.05)
    assert sampling.repetition_penalty == pytest.approx(1.2)
    plain = build_request(parse_args(["hi"])).sampling
    assert not any(plain.HasField(name) for name in ("seed", "temperature", "top_p", "top_k", "min_p",
                                                     "presence_penalty", "frequency_penalty", "repetition_penalty"))
    assert sampling.temperature == pytest.approx(0.7)


def test_help_names_defaults_only_where_the_flag_has_one(capsys):
    """The temperature default is the gateway's, as for every other client (it was greedy here only), and an
    unset flag's help no longer ends in "(default: None)"."""
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text
    assert "sampling seed (default: random)" in text and "new tokens at most (default: 128)" in text
    assert "default: the gateway's" in text
