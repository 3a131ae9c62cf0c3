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


def test_the_digest_is_sha256_of_the_contents(tmp_path):
    """The one hash of keys, manifests and the data key: SHA-256 (hashlib, independently) of the bytes."""
    import hashlib

    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(b"\x00\x01images")
    assert io.file_digest(f) == hashlib.sha256(b"\x00\x01images").hexdigest()[:io.DIGEST_LENGTH]
    assert io.digest("a", b"b", f) == hashlib.sha256(b"ab\x00\x01images").hexdigest()[:io.DIGEST_LENGTH]
    assert io.DIGEST_LENGTH >= 16  # 64 bits at least: no two data sets share a key by chance


def test_irregular_kind_says_what_an_entry_is_without_opening_it(tmp_path, monkeypatch):
    import os

    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "ok").symlink_to(tmp_path / "f")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")

    def no_open(*args, **kwargs):
        raise AssertionError("opened")

    monkeypatch.setattr(io.os, "open", no_open)
    kinds = {n: io.irregular_kind(tmp_path / n) for n in ("f", "d", "missing", "pipe", "zero", "ok", "broken")}
    assert kinds == {"f": None, "d": None, "missing": None, "pipe": "a FIFO",
                     "zero": "a link to a device (-> /dev/zero)",
                     "ok": f"a link to a regular file (-> {tmp_path / 'f'})",
                     "broken": f"a link to nothing (broken) (-> {tmp_path / 'nowhere'})"}
