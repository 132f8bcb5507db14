"""Bad input raises InvalidRequestError naming the field, and leaves the engine untouched."""

from __future__ import annotations

import pytest

from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams
from services.engine.tokenizer import ChatMessage
from services.engine.validation import RequestValidator
from tests.conftest import make_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(fp32_model, bundled_tokenizer):
    return make_engine(fp32_model, bundled_tokenizer, max_model_len=1024)


CASES = [
    ("empty prompt", dict(prompt=""), "prompt"),
    ("no input", dict(), "prompt"),
    ("prompt and token ids", dict(prompt="hi", token_ids=[1, 2]), "prompt"),
    ("empty token ids", dict(token_ids=[]), "token_ids"),
    ("prompt over the context", dict(prompt="word " * 1100), "prompt"),
    ("prompt plus max_tokens over the context", dict(prompt="hello", sampling=SamplingParams(max_tokens=1024)),
     "max_tokens"),
    ("max_tokens 0", dict(prompt="hi", sampling=SamplingParams(max_tokens=0)), "max_tokens"),
    ("negative temperature", dict(prompt="hi", sampling=SamplingParams(temperature=-0.5)), "temperature"),
    ("top_p 0", dict(prompt="hi", sampling=SamplingParams(top_p=0.0)), "top_p"),
    ("top_p above 1", dict(prompt="hi", sampling=SamplingParams(top_p=1.5)), "top_p"),
    ("nan temperature", dict(prompt="hi", sampling=SamplingParams(temperature=float("nan"))), "temperature"),
    ("negative top_k", dict(prompt="hi", sampling=SamplingParams(top_k=-3)), "top_k"),
    ("seed past 63 bits", dict(prompt="hi", sampling=SamplingParams(seed=2**63)), "seed"),
    # values the wire (int32 top_k, float32 temperature and top_p) cannot carry as given
    ("top_k past int32", dict(prompt="hi", sampling=SamplingParams(top_k=2**31)), "top_k"),
    ("temperature past float32", dict(prompt="hi", sampling=SamplingParams(temperature=1e300)), "temperature"),
    ("top_p that is 0 as a float32", dict(prompt="hi", sampling=SamplingParams(top_p=1e-50)), "top_p"),
    ("presence_penalty past 2", dict(prompt="hi", sampling=SamplingParams(presence_penalty=2.5)), "presence_penalty"),
    ("nan frequency_penalty", dict(prompt="hi", sampling=SamplingParams(frequency_penalty=float("nan"))),
     "frequency_penalty"),
    ("repetition_penalty 0", dict(prompt="hi", sampling=SamplingParams(repetition_penalty=0.0)), "repetition_penalty"),
    ("repetition_penalty that is 0 as a float32", dict(prompt="hi", sampling=SamplingParams(repetition_penalty=1e-50)),
     "repetition_penalty"),
    ("repetition_penalty past float32", dict(prompt="hi", sampling=SamplingParams(repetition_penalty=1e300)),
     "repetition_penalty"),
    ("subnormal repetition_penalty", dict(prompt="hi", sampling=SamplingParams(repetition_penalty=1e-40)),
     "repetition_penalty"),
    ("nan repetition_penalty", dict(prompt="hi", sampling=SamplingParams(repetition_penalty=float("nan"))),
     "repetition_penalty"),
    ("inf presence_penalty", dict(prompt="hi", sampling=SamplingParams(presence_penalty=float("inf"))),
     "presence_penalty"),
    ("inf min_p", dict(prompt="hi", sampling=SamplingParams(min_p=float("inf"))), "min_p"),
    ("logit_bias of a token outside the vocabulary",
     dict(prompt="hi", sampling=SamplingParams(logit_bias=((49152, 1.0),))), "logit_bias"),
    ("logit_bias past 100", dict(prompt="hi", sampling=SamplingParams(logit_bias=((5, 100.5),))), "logit_bias"),
    ("nan logit_bias", dict(prompt="hi", sampling=SamplingParams(logit_bias=((5, float("nan")),))), "logit_bias"),
    ("1025 biased tokens", dict(prompt="hi", sampling=SamplingParams(logit_bias=tuple((i, 1.0) for i in range(1025)))),
     "logit_bias"),
    ("nan min_p", dict(prompt="hi", sampling=SamplingParams(min_p=float("nan"))), "min_p"),
    ("negative min_p", dict(prompt="hi", sampling=SamplingParams(min_p=-0.1)), "min_p"),
    ("min_p above 1", dict(prompt="hi", sampling=SamplingParams(min_p=1.01)), "min_p"),
    ("token id past the vocabulary", dict(token_ids=[5, 49152]), "token_ids"),
    ("negative token id", dict(token_ids=[-1]), "token_ids"),
    ("stop token outside the vocabulary", dict(prompt="hi", sampling=SamplingParams(stop_token_ids=(10**6,))),
     "stop_token_ids"),
    ("empty stop string", dict(prompt="hi", sampling=SamplingParams(stop=("",))), "stop"),
    # checked on every new token of the batch: bounded
    ("1025 stop token ids", dict(prompt="hi", sampling=SamplingParams(stop_token_ids=(7,) * 1025)), "stop_token_ids"),
    ("65 stop strings", dict(prompt="hi", sampling=SamplingParams(stop=tuple(f"s{i}" for i in range(65)))), "stop"),
    ("a 1025-character stop string", dict(prompt="hi", sampling=SamplingParams(stop=("x" * 1025,))), "stop"),
    ("unknown chat role", dict(messages=[ChatMessage("wizard", "hi")]), "messages[0].role"),
    ("10 MB prompt", dict(prompt="x" * 10_000_000), "prompt"),
    ("10 MB chat message", dict(messages=[ChatMessage("user", "x" * 10_000_000)]), "messages"),
]


@pytest.mark.parametrize(("kwargs", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_rejected_with_the_field_named(engine, kwargs, field):
    free_before = engine.kv.num_free_blocks
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(**kwargs)
    assert info.value.field == field, str(info.value)
    assert not engine.has_unfinished()
    assert engine.kv.num_free_blocks == free_before
    engine.check_integrity()


def test_a_text_past_any_context_is_refused_before_tokenizing(engine):
    """The refusal comes from the length bound (no tokens counted), not from the tokenizer's answer."""
    limit = 1024 * engine.tokenizer.max_token_chars
    with pytest.raises(InvalidRequestError, match=f"is {limit + 1} characters") as info:
        engine.add_request(prompt="y" * (limit + 1))
    assert info.value.field == "prompt"


def test_token_ids_past_the_context_are_refused_before_they_are_read():
    """Millions of ids (a 64 MiB gRPC message holds 50M) were copied and checked against the vocabulary,
    seconds of the gateway's event loop, before their length was compared with the context."""
    class Unreadable:
        def __len__(self) -> int:
            return 50_000_000

        def __iter__(self):
            raise AssertionError("read")

    validator = RequestValidator(vocab_size=49152, max_model_len=1024)
    with pytest.raises(InvalidRequestError, match="50000000 tokens do not fit the context of 1024") as info:
        validator.encode_prompt(token_ids=Unreadable())
    assert info.value.field == "prompt"


def test_the_largest_stop_lists_are_accepted(engine):
    sampling = SamplingParams(max_tokens=2, stop=("x" * 1024,) * 64, stop_token_ids=tuple(range(1024)))
    engine.add_request("hi", sampling)
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()


def test_more_messages_than_the_context_has_tokens_are_refused_before_templating(engine, monkeypatch):
    """Empty messages pass the character bound, but the template gives each some tokens: rendering and
    tokenizing 100k of them held the gateway's event loop for seconds."""
    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", lambda *args, **kwargs: pytest.fail("templated"))
    with pytest.raises(InvalidRequestError, match="1024 messages cannot fit a context of 1024 tokens") as info:
        engine.add_request(messages=[ChatMessage("user", "")] * 1024)
    assert info.value.field == "messages"
    monkeypatch.undo()
    with pytest.raises(InvalidRequestError, match="do not fit the context"):  # fewer: the template's tokens count
        engine.add_request(messages=[ChatMessage("user", "")] * 1023)
    engine.check_integrity()


def test_duplicate_request_id_is_rejected(engine):
    engine.add_request("hi", SamplingParams(max_tokens=2), request_id="dup")
    with pytest.raises(InvalidRequestError, match="already running"):
        engine.add_request("hello", SamplingParams(max_tokens=2), request_id="dup")
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()


def test_engine_still_serves_after_bad_input(engine):
    with pytest.raises(InvalidRequestError):
        engine.add_request(token_ids=[49152])
    result = engine.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))[0]
    assert result.text.strip().startswith("Paris"), result.text
