"""States as key paths: flattening, the JSON record, putting values back."""

from __future__ import annotations

import collections
import json
import math

import pytest
import torch

from spmdtorch.checkpoint import UnsupportedValueError
from spmdtorch.checkpoint.tree import (
    decode,
    encode,
    flatten,
    keystr,
    orbax_tree,
    replace_values,
)


def test_flatten_kinds_and_paths():
    x = torch.ones(2, device="xla")
    state = {"model": {"w": x}, "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "groups": [{"lr": 0.1}]}, "step": 7}
    got = [(e.path, e.kind) for e in flatten(state)]
    assert got == [
        (("model", "w"), "xla"),
        (("opt", "state", 0, "step"), "cpu"),
        (("opt", "groups", 0, "lr"), "value"),
        (("step",), "value"),
    ]
    assert keystr(("opt", "state", 0, "step")) == "['opt']['state'][0]['step']"


def test_record_round_trips_plain_values_exactly():
    Pair = collections.namedtuple("Pair", "a b")
    values = {
        "big": 2**70 + 1,
        "f": 0.1,
        "nan": math.nan,
        "inf": -math.inf,
        "negzero": -0.0,
        "s": "é\n",
        "none": None,
        "b": True,
        "t": (1, (2.5, "x")),
        "l": [1, [None]],
        3: "int key",
        "nt": Pair(1, 2),
    }
    record = json.loads(json.dumps(encode(values, {}), allow_nan=False))  # strict JSON
    saved = decode(record)
    for e in flatten(values):
        kind, got = saved[e.path]
        assert kind == "value"
        if isinstance(e.value, float) and math.isnan(e.value):
            assert math.isnan(got)
        else:
            assert got == e.value and type(got) is type(e.value)
            if isinstance(got, float):
                assert math.copysign(1, got) == math.copysign(1, e.value)


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"a": {"b": object()}}, "['a']['b']"),
        ({"a": [1, torch.zeros(2, device="meta")]}, "['a'][1]"),
        ({"a": {True: 1}}, "['a']"),
        ({"a": {(1, 2): 1}}, "['a']"),
    ],
)
def test_unsupported_entries_name_their_path(bad, where):
    with pytest.raises(UnsupportedValueError, match=__import__("re").escape(where)):
        flatten(bad)


def test_orbax_name_collisions_are_refused():
    with pytest.raises(UnsupportedValueError, match=r"\['a.b'\].*\['a'\]\['b'\]|\['a'\]\['b'\].*\['a.b'\]"):
        orbax_tree({("a.b",): 1, ("a", "b"): 2})
    with pytest.raises(UnsupportedValueError, match="'0'"):
        orbax_tree({("d", 0): 1, ("d", "0"): 2})
    assert orbax_tree({("m", "fc.w"): 1, ("o", 0, "e"): 2}) == {"m": {"fc.w": 1}, "o": {"0": {"e": 2}}}


def test_replace_values_in_place_and_rebuilds_tuples():
    Pair = collections.namedtuple("Pair", "a b")
    inner = {"lr": 0.0}
    state = {"groups": [inner], "betas": (0.0, 0.0), "nt": Pair(0, {"k": 0})}
    out = replace_values(state, {("groups", 0, "lr"): 0.5, ("betas", 1): 0.9, ("nt", 1, "k"): 4})
    assert out is state and state["groups"][0] is inner and inner["lr"] == 0.5
    assert state["betas"] == (0.0, 0.9)
    assert isinstance(state["nt"], Pair) and state["nt"].b == {"k": 4}
