"""Property test of the readers (issue 16's fault suite): whatever bytes a line holds — deep nesting, huge
strings, wrong types, invalid UTF-8 — reading never raises anything but a clear DataFileError, every source row
comes back once, and source = emitted + quarantined for every kind."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.files import Quarantined, iter_canonical
from medgpt_ray.data.kinds import DataFileError

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["conversations", "from", "value", "role", "content", "text", "instruction", "output",
                     "question", "answer", "chosen", "rejected", "tools", "system", "x"]), inner, max_size=4),
    max_leaves=30)


def turn(role_key: str, text_key: str, role: str, text: object) -> dict:
    return {role_key: role, text_key: text}


# Rows close to the real formats (so conversion is exercised, not only parsing), with wrong types mixed in.
near_records = st.one_of(
    st.builds(lambda a, b: {"conversations": [turn("from", "value", "human", a), turn("from", "value", "gpt", b)]},
              st.text(max_size=40) | scalars, st.text(max_size=40) | scalars),
    st.builds(lambda t: {"text": t}, st.text(max_size=200) | scalars),
    st.builds(lambda q, c, r: {"conversations": [turn("from", "value", "human", q)], "chosen": c, "rejected": r},
              st.text(max_size=20), st.text(max_size=20) | scalars, st.text(max_size=20) | scalars),
    st.builds(lambda q, a: {"question": q, "answer": a}, st.text(max_size=20) | scalars, scalars),
)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


line_bytes = st.one_of(
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8")),
    near_records.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8")),
    st.integers(min_value=60, max_value=5000).map(lambda d: ('{"text": ' + deep(d) + "}").encode()),
    st.integers(min_value=1, max_value=300_000).map(lambda n: json.dumps({"text": "病" * n}).encode()),
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")),
)


def count_canonical(path: Path, kind: str) -> tuple[int, int, int]:
    source = emitted = quarantined = 0
    for item in iter_canonical([str(path)], kind):  # type: ignore[arg-type]
        source += 1
        if isinstance(item, Quarantined):
            quarantined += 1
        else:
            emitted += 1
    return source, emitted, quarantined


def spread_array(content: list[bytes]) -> list | None:
    """The array a .jsonl file holds over several lines (its first non-blank line opens it and is no JSON value
    alone; the whole parses as one array), else None: data/file_rows.py reads such a file as the array."""
    first = next((line.strip() for line in content if line.strip()), b"")
    if not first.startswith(b"["):
        return None
    try:
        json.loads(first)
        return None
    except (ValueError, RecursionError):
        pass
    try:
        whole = json.loads(b"\n".join(content).decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return whole if isinstance(whole, list) else None


@SETTINGS
@given(lines=st.lists(st.sampled_from([b"[", b"]", b"{}", b"{},", b"1,", b"[1]"]), min_size=1, max_size=6))
def test_a_jsonl_file_is_its_lines_or_the_array_it_spreads_over_them(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("arr") / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    array = spread_array(lines)
    assert len(list(iter_rows(path))) == (len(array) if array is not None else len(lines))


@SETTINGS
@given(lines=st.lists(line_bytes, min_size=1, max_size=12), kind=st.sampled_from(["pretrain", "sft", "preference",
                                                                                  "prompt"]))
@example(lines=[b"\xef\xbb\xbf"], kind="pretrain")  # found by CI: a file that is only a BOM holds no record
def test_jsonl_lines_of_any_bytes_never_crash_and_add_up(tmp_path_factory, lines, kind):
    path = tmp_path_factory.mktemp("prop") / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    # A UTF-8 BOM opening the file marks its encoding and is not content (data/file_rows.py drops it from line 1).
    content = [lines[0].removeprefix(b"\xef\xbb\xbf"), *lines[1:]]
    expected = sum(1 for line in content if line.strip())
    if (array := spread_array(content)) is not None:  # one JSON array over several lines: its elements are the rows
        expected = len(array)
    rows = list(iter_rows(path))
    assert len(rows) == expected and len({n for n, _ in rows}) == expected
    source, emitted, quarantined = count_canonical(path, kind)
    assert source == expected and source == emitted + quarantined


cells = st.text(max_size=40) | st.sampled_from(['"', ",", "\r\n", '""', "\x00"])


@SETTINGS
@given(rows=st.lists(st.lists(cells, min_size=1, max_size=4), min_size=0, max_size=8))
def test_csv_files_of_any_cells_give_rows_or_a_clear_file_error(tmp_path_factory, rows):
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["instruction", "output"])
    writer.writerows(rows)
    path = tmp_path_factory.mktemp("prop") / "in.csv"
    path.write_text(buf.getvalue(), encoding="utf-8")
    try:
        source, emitted, quarantined = count_canonical(path, "sft")
    except DataFileError as e:
        assert str(path) in str(e)  # names the file
        return
    assert source == emitted + quarantined
