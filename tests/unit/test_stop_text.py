"""OpenAI's `stop` (generation/stop_text.py, infer/limits.py): the answer ends before the first stop string, found
across pieces, with no part of a stop string ever sent; a bad `stop` is a 400 naming the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from medgpt_ray.generation.stop_text import StopText
from medgpt_ray.infer.limits import RequestError, ServeLimits, parse_chat


def run(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    stop = StopText(stops)
    sent = [stop.feed(p) for p in pieces]
    if not stop.hit:
        sent.append(stop.flush())
    return sent, stop.hit


def test_a_stop_split_across_pieces_is_found_and_never_sent():
    sent, hit = run(["头痛", "请多", "喝水<", "|end", "|>之后"], ["<|end|>"])
    assert hit and "".join(sent) == "头痛请多喝水" and not any("<" in s for s in sent)
    assert sent[2] == "喝水"  # "<" held back until the next piece tells


def test_the_earliest_of_several_stops_ends_the_answer_and_a_false_start_is_sent_late():
    assert run(["a STOP b END"], ["END", "STOP"]) == (["a "], True)
    sent, hit = run(["x <", "y"], ["<|end|>"])
    assert not hit and sent == ["x ", "<y", ""]


@given(st.text(alphabet="ab<|>", max_size=30), st.lists(st.integers(0, 30), max_size=6),
       st.lists(st.text(alphabet="ab<|>", min_size=1, max_size=4), min_size=1, max_size=4))
@example("><<", [2], ["<", "><<"])  # a later, shorter stop complete while an earlier one may still complete
def test_any_split_gives_the_text_up_to_the_first_stop(text, cuts, stops):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    sent, hit = run(pieces, stops)
    assert "".join(sent) == (text[:min(found)] if found else text) and hit == bool(found)


@pytest.mark.parametrize(("stop", "expected"), [(None, ()), ("。", ("。",)), (["a", "b"], ("a", "b"))])
def test_stop_is_read_as_openai_sends_it(stop, expected):
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": stop}
    assert parse_chat(json.dumps(body).encode(), ServeLimits()).stop == expected


@pytest.mark.parametrize("stop", [5, ["a", 1], ["a"] * 5, [""], ["x" * 300], {"a": 1}])
def test_a_bad_stop_is_refused_naming_the_field(stop):
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": stop}
    with pytest.raises(RequestError) as e:
        parse_chat(json.dumps(body).encode(), ServeLimits())
    assert e.value.field == "stop"
