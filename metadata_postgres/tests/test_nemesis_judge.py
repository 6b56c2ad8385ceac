"""The nemesis run's judge catches each kind of violation (no cluster needed)."""

from __future__ import annotations

from walstream_metadata_postgres.testing.nemesis import StreamUnderNemesis, judge


def acknowledged_stream(*values: str) -> StreamUnderNemesis:
    """A stream whose clients appended ``values`` one by one, each acknowledged in order."""
    stream = StreamUnderNemesis("s", 0)
    for offset, value in enumerate(values):
        stream.sent.add(value)
        operation = stream.history.invoke(0, "append", values=(value.encode(),), match_tail=offset)
        stream.history.ok(operation, (offset, offset + 1))
        stream.acknowledged[value] = offset
    return stream


def test_a_clean_stream_has_no_violation() -> None:
    assert judge(acknowledged_stream("a", "b", "c"), ["a", "b", "c"]) == []


def test_a_lost_acknowledged_record_is_a_violation() -> None:
    violations = judge(acknowledged_stream("a", "b", "c"), ["a", "b"])
    assert any("acknowledged 'c' at seq num 2 is lost" in line for line in violations)
    assert any("not linearizable" in line for line in violations)


def test_a_duplicated_record_is_a_violation() -> None:
    violations = judge(acknowledged_stream("a", "b"), ["a", "b", "b"])
    assert any("'b' duplicated at seq nums [1, 2]" in line for line in violations)


def test_a_record_nobody_sent_is_a_violation() -> None:
    violations = judge(acknowledged_stream("a"), ["a", "zombie"])
    assert any("'zombie' at [1] was never sent" in line for line in violations)


def test_a_record_read_then_replaced_is_a_violation() -> None:
    """A zombie's write that a reader saw and that a later owner replaced."""
    stream = acknowledged_stream("a")
    stream.sent.update({"zombie", "b"})
    stream.observe(1, ("zombie",), "read through node 1")
    violations = judge(stream, ["a", "b"])
    assert any("a read saw 'zombie' at seq num 1" in line for line in violations)


def test_an_ambiguous_append_may_land_or_not() -> None:
    for final in (["a"], ["a", "maybe"]):
        stream = acknowledged_stream("a")
        stream.sent.add("maybe")
        operation = stream.history.invoke(1, "append", values=(b"maybe",), match_tail=1)
        operation.outcome = "ambiguous"
        assert judge(stream, final) == []
