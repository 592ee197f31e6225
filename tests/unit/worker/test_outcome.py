"""gpuq.worker.outcome's payload decoding: json.loads' values and errors, by a shorter path."""

from __future__ import annotations

import json

import pytest

from gpuq.worker.outcome import decode


@pytest.mark.parametrize("text", ['{"i":1}', ' {"a": [1, 2.5, null]} ', '"x"', "1", "null", '{"a":"é"}',
                                  "1.5e3", '[{"b":{}}]', "7", " 1", "1 ", "[1]\n"])
def test_a_payload_decodes_as_json_loads_decodes_it(text: str) -> None:
    assert decode(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a":1}x', "[1,]", "\ufeff1", "NaN1", "1 2", "x",
                                  '{"a": }', '"open'])
def test_a_malformed_payload_raises_json_loads_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        decode(text)
    assert str(got.value) == str(expected.value)
