"""JSON read as it streams (runtime/grammar/partial_json.py): a prefix of a text reads as a
prefix of the whole text's nodes, a complete value's span parses to the value itself, and text
that cannot start JSON is refused with where it went wrong."""

from __future__ import annotations

import json

import pytest

from edgespec.runtime.grammar.partial_json import Node, values

TEXT = '{"name": "f", "args": {"xs": [1, 2.5, {"y": null}], "s": "a\\"b"}, "e": []}; [true ,{}]'


def spans(node: Node) -> list[tuple[int, int, bool]]:
    out = [(node.start, node.end, node.done)]
    for child in [*node.members.values(), *node.items]:
        out += spans(child)
    return out


def test_every_prefix_reads_as_a_prefix_of_the_whole_texts_nodes():
    whole = values(TEXT)
    assert [json.loads(n.text(TEXT)) for n in whole] == [
        json.loads(TEXT.split(";")[0]),
        [True, {}],
    ]
    done = {(s, e) for n in whole for s, e, d in spans(n) if d}
    for cut in range(len(TEXT) + 1):
        part = TEXT[:cut]
        nodes = values(part)
        assert len(nodes) <= len(whole)
        for node in nodes:
            for start, end, is_done in spans(node):
                assert TEXT.startswith(part[start:end], start)
                if is_done:  # a complete value is complete in the whole text, same span
                    assert (start, end) in done


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"a" 1}', "':' expected at 5"),
        ("[1 2]", "',' or ']' expected at 3"),
        ('{"a": 1 "b": 2}', "',' or '}' expected at 8"),
        ("{1: 2}", "an object key expected at 1"),
    ],
)
def test_text_that_cannot_be_json_is_refused_where_it_goes_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        values(text)


def test_an_empty_container_and_a_cut_one():
    (obj, arr) = values("{ } [ ")
    assert (obj.kind, obj.done, obj.end) == ("object", True, 3)
    assert (arr.kind, arr.done, arr.items) == ("array", False, [])
