"""The nemesis run's judge catches each kind of violation (no cluster needed)."""

from __future__ import annotations

from walstream_metadata_postgres.testing.nemesis import (
    StreamUnderNemesis,
    judge,
    relevant,
    stale_tails,
    violation_kind,
)


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


def test_a_tail_older_than_an_acknowledged_append_is_a_stale_tail() -> None:
    """A read invoked after an append was acknowledged names the tail before it (what a node
    answering from a view it can no longer vouch for would say)."""
    for start, result in ((1, ((), 1)), (2, ("out_of_range", 0, 1))):
        stream = acknowledged_stream("a", "b")
        read = stream.invoke(100, "read", "http://127.0.0.1:7402", start=start, limit=10)
        stream.history.ok(read, result)
        violations = stale_tails(stream)
        assert len(violations) == 1 and "stale tail 1" in violations[0], violations
        assert "via='7402'" in violations[0] and "named tail 2" in violations[0]
        assert any(violation_kind(line) == "stale_tail" for line in judge(stream, ["a", "b"]))


def test_a_tail_named_while_the_append_was_in_flight_is_not_stale() -> None:
    stream = acknowledged_stream("a")
    read = stream.invoke(100, "read", "http://127.0.0.1:7401", start=1, limit=10)
    append = stream.invoke(0, "append", "http://127.0.0.1:7402", values=(b"b",), match_tail=1)
    stream.sent.add("b")
    stream.history.ok(append, (1, 2))
    stream.acknowledged["b"] = 1
    stream.history.ok(read, ((), 1))  # it began before "b" was acknowledged: tail 1 is fine
    assert stale_tails(stream) == []
    assert judge(stream, ["a", "b"]) == []


def test_operations_of_unknown_outcome_that_cannot_matter_are_left_out_of_the_check() -> None:
    stream = acknowledged_stream("a")
    unknown_read = stream.invoke(100, "read", "http://127.0.0.1:7401", start=0, limit=10)
    unknown_read.outcome = "ambiguous"
    never = stream.invoke(0, "append", "http://127.0.0.1:7401", values=(b"never",), match_tail=1)
    never.outcome = "ambiguous"
    landed = stream.invoke(1, "append", "http://127.0.0.1:7401", values=(b"late",), match_tail=1)
    landed.outcome = "ambiguous"
    stream.sent.update({"never", "late"})
    kept = relevant(stream, ["a", "late"])
    assert unknown_read not in kept and never not in kept  # they constrain nothing
    assert landed in kept  # its record is there: it took effect, somewhere after its invocation
    assert judge(stream, ["a", "late"]) == []
    assert any("not linearizable" in line for line in judge(stream, ["late", "a"]))
