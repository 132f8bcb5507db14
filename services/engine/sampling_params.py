"""Per-request sampling settings and their validation.

``SamplingParams`` is the one declaration of the sampling fields: the gateway's ``SamplingFields`` (what a
client gave) and the proto conversions (``services.common.sampling_convert``) are derived from its fields.
A field declared with ``unset_takes(default)`` is one a client may leave unset (``optional`` on the wire,
``None`` in ``SamplingFields``); unset, it takes ``default``, the server's default, declared here once. The
other client fields (lists, flags, counts) have no unset state: their default is what an absent one means.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from services.engine.bad_words import check_bad_words
from services.engine.errors import InvalidRequestError
from services.engine.logprobs import MAX_LOGPROBS
from services.engine.structured_spec import StructuredSpec

DEFAULT_MAX_TOKENS = 16
GREEDY_BELOW_TEMPERATURE = 1e-5  # as vLLM: dividing logits by less overflows float32 to inf, softmax to NaN
INT32_MAX = 2**31 - 1  # top_k travels as int32, temperature and top_p as float32 (pdserve.v1.SamplingParams)
SEED_LIMIT = 2**63  # seeds are distinct below it (the sampler's generators take 63 bits)
# Every new token is checked against every stop string and stop token id (and while min_tokens is unmet
# every stop token is masked): bounded, so that one request's lists cannot slow a whole batch.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_PENALTY = 2.0  # presence and frequency penalties: OpenAI's range, as vLLM's
# vLLM takes any repetition penalty > 0; a subnormal one made logit / penalty infinite (softmax NaN: token 0)
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
MAX_LOGIT_BIAS = 1024  # tokens biased by one request (applied to every new token: bounded, as stop ids)
MAX_LOGIT_BIAS_VALUE = 100.0  # OpenAI's range


UNSET_TAKES_DEFAULT = "unset_takes_default"  # field metadata: a client may leave it unset
ENGINE_ONLY = "engine_only"  # field metadata: not a client setting (not on the wire, not in SamplingFields)


def unset_takes(default: Any) -> Any:
    """A sampling field a client may leave unset: unset, it is ``default`` (the server's default)."""
    return field(default=default, metadata={UNSET_TAKES_DEFAULT: True})


def as_float32(value: float) -> float:
    """``value`` as the 32-bit float it becomes on the wire (overflow → inf, underflow → 0)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def require_utf8(field: str, text: str) -> None:
    """Refuse a text that has no UTF-8 form: a lone surrogate (JSON allows ``"\\ud800"``) would fail the
    tokenizer and every proto string field."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidRequestError(field, f"is not valid Unicode: a lone surrogate {text[error.start]!r} at "
                                         f"character {error.start}") from None


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each new token and when to stop (the fields of ``pdserve.v1.SamplingParams``).

    ``temperature`` below 1e-5 (0 included; compared as 32-bit floats) is greedy. ``top_k <= 0`` and
    ``top_p == 1`` disable those filters. ``seed`` makes random sampling reproducible per request,
    independent of what else is in the batch.
    ``logprobs``: None = none; ``k`` = each new token's logprob and the ``k`` most likely (``logprobs.py``).
    ``prompt_logprobs`` (vLLM's): the same for every prompt token after the first (the first has none); the
    whole prompt is computed then, none of it served from the prefix cache.

    Penalties, as vLLM and OpenAI define them, change the logits before the temperature (greedy requests
    too; ``penalties.py``): ``presence_penalty`` is subtracted from every token already generated,
    ``frequency_penalty`` times the number of times it was; ``repetition_penalty`` (CTRL) divides the
    positive logits of every token of the prompt or the output by it and multiplies the negative ones.
    ``min_p`` (random sampling only, after the temperature) drops the tokens less likely than ``min_p``
    times the most likely one. ``logit_bias`` (OpenAI's) adds each bias to its token's logit, before the
    penalties: -100 all but bans a token, +100 all but forces it. Logprobs stay those of the raw distribution.
    ``allowed_token_ids`` (vLLM's): only these ids may be sampled (applied as a structured output's mask is,
    and with it: both must allow an id); an end of sequence not among them never comes. ``bad_words`` (vLLM's):
    words the output may not complete (``bad_words.py``: each word's tokens, its last banned where the output
    ends with the others).

    The text (``detokenizer.py``; vLLM's semantics): a stop string ends it and is cut from it, and so is the
    end-of-sequence or stop token that ended a request, unless ``include_stop_str_in_output``; special tokens
    have no text unless ``skip_special_tokens`` is False. Neither changes the tokens.
    """

    max_tokens: int = unset_takes(DEFAULT_MAX_TOKENS)  # the gateway's default depends on the prompt
    temperature: float = unset_takes(1.0)
    top_p: float = unset_takes(1.0)
    top_k: int = unset_takes(0)
    seed: int | None = unset_takes(None)  # the gateway draws a random one
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = unset_takes(None)
    presence_penalty: float = unset_takes(0.0)
    frequency_penalty: float = unset_takes(0.0)
    repetition_penalty: float = unset_takes(1.0)
    min_p: float = unset_takes(0.0)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    structured: StructuredSpec | None = None  # constrained output (structured_spec.py); None = free
    allowed_token_ids: tuple[int, ...] = ()  # vLLM's: when given, the only ids the request may sample
    prompt_logprobs: int | None = unset_takes(None)  # each prompt token's logprob and the k most likely
    include_stop_str_in_output: bool = False  # the text keeps the stop string (or stop token) that ended it
    skip_special_tokens: bool = unset_takes(True)  # False: special tokens' text is in the output
    bad_words: tuple[str, ...] = ()  # vLLM's: words the output may not contain (bad_words.py)
    extra: dict[str, object] = field(default_factory=dict, compare=False, repr=False, metadata={ENGINE_ONLY: True})

    @property
    def greedy(self) -> bool:
        # both as the 32-bit floats the wire carries (1e-5 is 9.99999975e-06 there): a node that got the
        # temperature over gRPC and an engine given the Python float agree on every value, 1e-5 included
        return as_float32(self.temperature) < as_float32(GREEDY_BELOW_TEMPERATURE)

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes this request's logits (``penalties.py``)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def validate(self, vocab_size: int) -> None:
        """Raise :class:`InvalidRequestError` naming the first bad field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if not math.isfinite(as_float32(self.temperature)) or self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0 and a finite 32-bit float, got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < as_float32(self.top_p) <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1] as a 32-bit float, got {self.top_p}")
        if not 0 <= self.top_k <= INT32_MAX:
            raise InvalidRequestError("top_k", f"must be in [0, {INT32_MAX}] (0 disables it), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise InvalidRequestError("seed", f"must be in [0, 2**63), got {self.seed}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise InvalidRequestError(name, f"must be in [0, {MAX_LOGPROBS}], got {k}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:  # NaN and infinities too
                raise InvalidRequestError(name, f"must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:  # NaN too
            raise InvalidRequestError("repetition_penalty", f"must be in [{MIN_REPETITION_PENALTY}, "
                                                            f"{MAX_REPETITION_PENALTY}] (1 disables it), "
                                                            f"got {self.repetition_penalty}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}")
        for token_id, bias in self.logit_bias:
            if not 0 <= token_id < vocab_size:
                raise InvalidRequestError("logit_bias", f"token {token_id} is outside the vocabulary [0, {vocab_size})")
            if not -MAX_LOGIT_BIAS_VALUE <= bias <= MAX_LOGIT_BIAS_VALUE:  # NaN too
                limit = f"{MAX_LOGIT_BIAS_VALUE:g}"
                raise InvalidRequestError("logit_bias", f"the bias of token {token_id} must be in [-{limit}, {limit}], "
                                                        f"got {bias}")
        if not math.isfinite(self.min_p) or not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p", f"must be in [0, 1] (0 disables it), got {self.min_p}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise InvalidRequestError("min_tokens", f"must be in [0, max_tokens], got {self.min_tokens}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids, got "
                                                        f"{len(self.stop_token_ids)}")
        if len(self.allowed_token_ids) > vocab_size:
            raise InvalidRequestError("allowed_token_ids", f"at most {vocab_size} ids (the vocabulary), got "
                                                           f"{len(self.allowed_token_ids)}")
        for name in ("stop_token_ids", "allowed_token_ids"):
            for token_id in getattr(self, name):
                if not 0 <= token_id < vocab_size:
                    raise InvalidRequestError(name, f"{token_id} is outside the vocabulary [0, {vocab_size})")
        for word in self.bad_words:
            require_utf8("bad_words", word)
        check_bad_words(self.bad_words)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop", "stop strings must not be empty")
        longest = max(self.stop, key=len, default="")
        if len(longest) > MAX_STOP_CHARS:
            raise InvalidRequestError("stop", f"a stop string is at most {MAX_STOP_CHARS} characters, got one of "
                                              f"{len(longest)}")
        for stop in self.stop:
            require_utf8("stop", stop)
        if self.structured is not None:
            self.structured.check_shape()


def client_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The fields of ``SamplingParams`` a client sets (all but the engine-only ones), in declaration order."""
    return tuple(f for f in dataclasses.fields(SamplingParams) if not f.metadata.get(ENGINE_ONLY))


def takes_default_when_unset(f: dataclasses.Field[Any]) -> bool:
    """Whether a client may leave field ``f`` unset (declared with ``unset_takes``)."""
    return bool(f.metadata.get(UNSET_TAKES_DEFAULT))


EMBEDDING_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)
"""An embedding request's (``PrefillRole.admit_embedding``): one greedy token, which ends it and is not used."""
