"""Proto SamplingParams ↔ engine SamplingParams: unset takes the default, an explicit 0 stays 0."""

from __future__ import annotations

import dataclasses

import pytest
from pdserve.v1 import gateway_pb2

from services.common.sampling_convert import (
    STRUCTURED,
    SamplingFields,
    default_max_tokens,
    fields_from_proto,
    random_seed,
    sampling_from_proto,
    sampling_to_proto,
)
from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import SamplingParams, client_fields, takes_default_when_unset
from services.engine.structured_spec import StructuredSpec


def test_unset_fields_take_the_defaults():
    params = sampling_from_proto(gateway_pb2.SamplingParams(), default_max_tokens=77, default_seed=5)
    assert params == SamplingParams(max_tokens=77, temperature=1.0, top_p=1.0, top_k=0, seed=5)


def test_explicit_zeros_are_kept_apart_from_unset():
    message = gateway_pb2.SamplingParams(max_tokens=0, temperature=0.0, top_k=0, seed=0)
    fields = fields_from_proto(message)
    assert (fields.max_tokens, fields.temperature, fields.top_k, fields.seed, fields.top_p) == (0, 0.0, 0, 0, None)
    params = fields.resolve(default_max_tokens=77, default_seed=5)
    assert (params.max_tokens, params.temperature, params.seed, params.greedy) == (0, 0.0, 0, True)
    with pytest.raises(InvalidRequestError) as error:
        params.validate(vocab_size=100)
    assert error.value.field == "max_tokens"


def test_top_k_minus_one_means_no_limit():
    assert sampling_from_proto(gateway_pb2.SamplingParams(top_k=-1)).top_k == 0
    assert sampling_from_proto(gateway_pb2.SamplingParams(top_k=-2)).top_k == -2  # validation names it


def test_round_trip_keeps_every_field():
    params = SamplingParams(max_tokens=12, temperature=0.5, top_p=0.25, top_k=40, seed=(1 << 63) - 1,
                            stop=("\n\n", "END"), stop_token_ids=(2, 7), ignore_eos=True, min_tokens=3, logprobs=2,
                            presence_penalty=-0.5, frequency_penalty=1.25, repetition_penalty=1.125, min_p=0.0625,
                            logit_bias=((3, -100.0), (11, 0.5)))
    message = sampling_to_proto(params)
    assert all(message.HasField(f) for f in ("max_tokens", "temperature", "top_p", "top_k", "seed", "logprobs",
                                             "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"))
    assert sampling_from_proto(gateway_pb2.SamplingParams.FromString(message.SerializeToString())) == params


def test_unset_penalties_are_off_and_an_explicit_zero_is_kept_for_validation():
    assert sampling_from_proto(gateway_pb2.SamplingParams()) == SamplingParams()
    assert not SamplingParams().penalized
    explicit = sampling_from_proto(gateway_pb2.SamplingParams(repetition_penalty=0.0))
    assert explicit.repetition_penalty == 0.0  # not "off": validation refuses it, naming the field


def test_round_trip_without_a_seed_leaves_it_unset():
    message = sampling_to_proto(SamplingParams(max_tokens=3))
    assert not message.HasField("seed")
    assert sampling_from_proto(message, default_seed=None).seed is None


def test_resolved_params_need_no_defaults_on_the_receiving_node():
    client = gateway_pb2.SamplingParams(temperature=0.7, top_p=0.9)  # float32 on the wire
    resolved = fields_from_proto(client).resolve(default_max_tokens=256, default_seed=99)
    again = sampling_from_proto(sampling_to_proto(resolved), default_max_tokens=1, default_seed=1)
    assert again == resolved  # the gateway and the nodes sample with the very same values
    assert (again.max_tokens, again.seed) == (256, 99)


def test_fields_default_to_unset():
    assert SamplingFields().resolve(default_max_tokens=3) == SamplingParams(max_tokens=3)


def test_default_max_tokens_is_capped_by_the_context():
    assert default_max_tokens(10, 8192) == 256
    assert default_max_tokens(8000, 8192) == 192
    assert default_max_tokens(8192, 8192) == 1  # the prompt check refuses it, naming "prompt"


def test_random_seeds_are_63_bit_and_differ():
    seeds = {random_seed() for _ in range(8)}
    assert len(seeds) == 8 and all(0 <= s < 1 << 63 for s in seeds)


# A value unlike the default for each annotation of a SamplingParams field (a field of a new type: add one).
_NON_DEFAULT = {"int": 7, "float": 0.5, "bool": True, "int | None": 5, "tuple[str, ...]": ("END", "\n"),
                "tuple[int, ...]": (3, 9), "tuple[tuple[int, float], ...]": ((3, -100.0), (11, 0.5)),
                "StructuredSpec | None": StructuredSpec("regex", "[0-9]+")}
_NON_DEFAULT_OF = {"skip_special_tokens": False}  # a field whose default is its type's value above


def _non_default_params() -> SamplingParams:
    values = {f.name: _NON_DEFAULT_OF.get(f.name, _NON_DEFAULT[str(f.type)]) for f in client_fields()}
    assert all(values[f.name] != f.default for f in client_fields())
    return SamplingParams(**values)


def test_sampling_fields_has_every_field_of_sampling_params():
    fields = {f.name: f for f in dataclasses.fields(SamplingFields)}
    assert list(fields) == [f.name for f in client_fields()]
    for f in client_fields():
        unset = fields[f.name].default
        assert unset is None if takes_default_when_unset(f) else unset == f.default, f.name


def test_every_field_round_trips_proto_fields_params():
    """A field added to SamplingParams (and the proto) flows through the conversions with no more code."""
    params = _non_default_params()
    message = gateway_pb2.SamplingParams.FromString(sampling_to_proto(params).SerializeToString())
    fields = fields_from_proto(message)
    assert all(getattr(fields, f.name) == getattr(params, f.name) for f in client_fields())
    assert fields.resolve(default_max_tokens=1, default_seed=1) == params


def test_the_wire_marks_unset_where_sampling_params_says_a_client_may_leave_it():
    wire = gateway_pb2.SamplingParams.DESCRIPTOR.fields_by_name
    scalars = [f for f in client_fields() if f.name != STRUCTURED]  # a message: unset = no constraint, no default
    assert {f.name: takes_default_when_unset(f) for f in scalars} == \
        {f.name: wire[f.name].has_presence for f in scalars}
    unset = fields_from_proto(gateway_pb2.SamplingParams())
    assert all(getattr(unset, f.name) is None for f in client_fields() if takes_default_when_unset(f))


SPECS = [StructuredSpec("json_schema", '{"type": "object"}'), StructuredSpec("json_object"),
         StructuredSpec("regex", "[a-z]+"), StructuredSpec("choice", choices=("yes", "no", "")),
         StructuredSpec("grammar", 'start: "a" | "b"')]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
def test_a_structured_spec_survives_every_hop_of_the_cluster(spec):
    """gateway → PrefillRequest, prefill → ReserveRequest, decode → AdoptRequest: each hop is a
    ``sampling_to_proto`` read back by ``sampling_from_proto`` (through the bytes of the wire)."""
    params = SamplingParams(max_tokens=9, temperature=0.7, seed=3, stop=("x",), structured=spec)
    for _ in range(3):
        wire = gateway_pb2.SamplingParams.FromString(sampling_to_proto(params).SerializeToString())
        params = sampling_from_proto(wire)
    assert params.structured == spec and params.max_tokens == 9 and params.stop == ("x",)


def test_a_structured_output_with_no_kind_is_refused_naming_the_field():
    message = gateway_pb2.SamplingParams(max_tokens=4, structured=gateway_pb2.StructuredOutput())
    fields = fields_from_proto(message)
    assert fields.structured == StructuredSpec("")
    with pytest.raises(InvalidRequestError, match="structured_output: kind must be one of"):
        fields.resolve().validate(vocab_size=100)


def test_no_structured_output_is_none_and_stays_off_the_wire():
    assert fields_from_proto(gateway_pb2.SamplingParams()).structured is None
    assert not sampling_to_proto(SamplingParams()).HasField("structured")
