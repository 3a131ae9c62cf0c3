"""lowrank.core.io.parse_once: a parsed text handed out as the parser gives it, once per text."""

import json

import pytest
import yaml

from lowrank.core import io

calls = []


def _counting_load(text):
    calls.append(text)
    return yaml.safe_load(text)


def test_parse_once_equals_the_parser_and_parses_each_text_once():
    calls.clear()
    text = "a: [1, 2, {b: 3.5}]\nc: x\n"
    first, second = io.parse_once(_counting_load, text), io.parse_once(_counting_load, text)
    assert first == second == yaml.safe_load(text)
    assert calls == [text]
    io.parse_once(_counting_load, text.replace("x", "y"))  # another text (a file rewritten in the same tick)
    assert len(calls) == 2


def test_parse_once_hands_out_copies_a_caller_may_change():
    text = '{"a": [1, 2], "b": {"c": 1}}'
    got = io.parse_once(json.loads, text)
    got["a"].append(3)
    got["b"]["c"] = 99
    assert io.parse_once(json.loads, text) == json.loads(text)


def test_parse_once_raises_every_time_for_a_bad_text():
    calls.clear()
    for _ in range(2):
        with pytest.raises(yaml.YAMLError):
            io.parse_once(_counting_load, "a: [1, 2\n")
    assert len(calls) == 2
