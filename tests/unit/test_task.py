"""gpuq.task: priorities, validation at the boundary, the stored record."""

from __future__ import annotations

import json
import math
import os

import pytest

from gpuq.errors import InvalidTask
from gpuq.task import (
    MAX_PAYLOAD_BYTES,
    Priority,
    State,
    TaskRecord,
    TaskSpec,
    build_specs,
    ended_count,
    new_task_id,
    parse_payload_text,
)


@pytest.mark.parametrize("value, expected", [
    ("P0", 0), ("p1", 1), (" P2 ", 2), ("P3", 3),
    (0, 0), (1, 1), (2, 2), (3, 3), ("0", 0), ("3", 3),
    ("online", 0), ("nearline", 1), ("batch", 2), ("Offline", 3),
    (Priority.P1, 1),
])
def test_priority_parse_accepts_labels_numbers_and_names(value: object, expected: int) -> None:
    assert Priority.parse(value) is Priority(expected)


@pytest.mark.parametrize("value", [
    "P4", "p-1", 4, -1, "urgent", "", None, True, False, 1.0, "1.0", [0],
])
def test_priority_parse_rejects_bad_values(value: object) -> None:
    with pytest.raises(InvalidTask, match="unknown priority"):
        Priority.parse(value)


def test_priority_label_and_terminal_states() -> None:
    assert [p.label for p in Priority] == ["P0", "P1", "P2", "P3"]
    assert {s for s in State if s.terminal} == {
        State.SUCCEEDED, State.FAILED, State.EXPIRED, State.CANCELED}


def build(**overrides: object) -> TaskSpec:
    args: dict[str, object] = {"handler": "h", "payload": {"x": 1}, "model": "A", "vram_gb": 8}
    args.update(overrides)
    handler, payload = args.pop("handler"), args.pop("payload")
    return TaskSpec.build(handler, payload, **args)  # type: ignore[arg-type]


def test_build_valid_spec_defaults() -> None:
    s = build(priority="online", est_s=0, deadline_s=2.5, tenant="acme", max_attempts=1)
    assert s.priority is Priority.P0 and s.payload == '{"x":1}' and s.vram_gb == 8.0
    assert s.est_s == 0.0 and s.deadline_s == 2.5 and s.tenant == "acme" and s.max_attempts == 1
    assert len(s.task_id) == 32 and build().task_id != s.task_id


@pytest.mark.parametrize("vram", [0, -1, -0.5, math.nan, math.inf, -math.inf, True, False,
                                  "8", None, [8], 1e308, 10**400, 1.1e6])
def test_build_rejects_bad_vram(vram: object) -> None:
    with pytest.raises(InvalidTask, match="vram_gb"):
        build(vram_gb=vram)


@pytest.mark.parametrize("est", [-1, math.nan, math.inf, True, "1", 1e11, 10**400])
def test_build_rejects_bad_estimate(est: object) -> None:
    with pytest.raises(InvalidTask, match="est_s"):
        build(est_s=est)


@pytest.mark.parametrize("priority", ["P9", 7, "soon", True, None])
def test_build_rejects_unknown_priority(priority: object) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        build(priority=priority)


BAD_NAMES = ["", "   ", "a b", "a{b", "a}b", "{pool}", "a,b", "a\tb", "a\nb", "x" * 201, 7,
             "a\x00b", "m\x01", "m\x1b[31mRED", "a\x7f", "a\x9bb", "a\u2028b"]


@pytest.mark.parametrize("field, bad", [
    *((f, b) for f in ("handler", "model", "tenant", "task_id") for b in BAD_NAMES),
    ("handler", None), ("model", None), ("tenant", None),  # task_id=None: generate one
])
def test_build_rejects_bad_names(field: str, bad: object) -> None:
    with pytest.raises(InvalidTask, match=field):
        build(**{field: bad})


def test_build_accepts_a_name_of_max_length() -> None:
    assert build(model="m" * 200).model == "m" * 200
    assert build(model="modèle-ü:1").model == "modèle-ü:1"


def test_a_name_too_long_is_said_so_in_a_short_line() -> None:
    with pytest.raises(InvalidTask) as info:
        build(model="x" * 5000)
    assert "longer than 200 characters" in str(info.value) and len(str(info.value)) < 200


def test_build_rejects_oversized_payload() -> None:
    with pytest.raises(InvalidTask, match="larger than"):
        build(payload={"blob": "a" * MAX_PAYLOAD_BYTES})
    build(payload="a" * (MAX_PAYLOAD_BYTES - 10))  # just under the cap: fine


def test_payload_size_counts_bytes_of_non_ascii_text() -> None:
    spec = build(payload={"t": "é漢🙂" * 10})
    assert len(spec.payload.encode()) == len(spec.payload)  # escaped: the cap counts bytes
    with pytest.raises(InvalidTask, match="larger than"):
        build(payload="é" * (MAX_PAYLOAD_BYTES // 6 + 1))  # each one \u00e9: six bytes


def test_a_name_seen_valid_does_not_pass_another_kind_of_value() -> None:
    build(model="m-seen")
    with pytest.raises(InvalidTask, match="model"):
        build(model=["m-seen"])


@pytest.mark.parametrize("item, match", [
    ({"model": "m", "vram_gb": 1}, "handler"),
    ({"handler": "h", "model": "m", "vram_gb": 1, "vram": 2}, "vram"),
    ({"handler": "h", "model": "m", "vram_gb": -1}, "vram_gb"),  # a value out of range too
])
def test_bulk_item_without_handler_or_with_unknown_option_is_invalid(item: dict[str, object],
                                                                      match: str) -> None:
    good = {"handler": "h", "model": "m", "vram_gb": 1}
    with pytest.raises(InvalidTask, match=rf"task 1 of the batch: .*{match}") as info:
        build_specs([good, item])
    assert "TaskSpec" not in str(info.value)  # enqueue's words, not an internal function's


def test_a_bulk_item_that_is_not_a_mapping_is_named_so() -> None:
    with pytest.raises(InvalidTask, match=r"task 0 of the batch: must be a mapping, not NoneType$"):
        build_specs([None])  # type: ignore[list-item]


@pytest.mark.parametrize("payload", [{1, 2}, b"bytes", bytearray(b"x"), object(), math.nan,
                                     {"x": math.inf}, {"f": print}])
def test_build_rejects_non_json_payload(payload: object) -> None:
    with pytest.raises(InvalidTask, match="payload"):
        build(payload=payload)


@pytest.mark.parametrize("payload", [None, 0, "text", [1, "a", None], {"nested": {"k": [1.5]}}])
def test_build_encodes_json_payload(payload: object) -> None:
    assert json.loads(build(payload=payload).payload) == payload


@pytest.mark.parametrize("attempts", [0, -1, 101, 1.5, 3.0, True, "3", None])
def test_build_rejects_max_attempts_out_of_range(attempts: object) -> None:
    with pytest.raises(InvalidTask, match="max_attempts"):
        build(max_attempts=attempts)


@pytest.mark.parametrize("deadline", [0, -1, math.nan, math.inf, True, "5", [1], 1e308, 1e20,
                                      10**400])
def test_build_rejects_bad_deadline(deadline: object) -> None:
    with pytest.raises(InvalidTask, match="deadline_s"):
        build(deadline_s=deadline)


@pytest.mark.parametrize("text", ["{", "{'a': 1}", "[1,", "", "nope", '{"a":1} x'])
def test_parse_payload_text_rejects_malformed_json(text: str) -> None:
    with pytest.raises(InvalidTask, match="not valid JSON"):
        parse_payload_text(text)


def test_parse_payload_text_accepts_json() -> None:
    assert parse_payload_text('{"prompt": "hi", "n": [1, 2]}') == {"prompt": "hi", "n": [1, 2]}


def stored_fields(spec: TaskSpec, **extra: str) -> dict[str, str]:
    """The hash the enqueue script writes for a spec (docs/PROTOCOL.md §2), plus extras."""
    fields = {
        "id": spec.task_id, "handler": spec.handler, "payload": spec.payload,
        "model": spec.model, "vram_gb": "8", "priority": str(int(spec.priority)),
        "est_s": "0.4", "deadline": "", "preemptible": "1" if spec.preemptible else "0",
        "tenant": spec.tenant, "max_attempts": str(spec.max_attempts), "attempt": "0",
        "state": "queued", "score": "1700000000200", "enqueued_at": "1700000000000",
        "queued_at": "1700000000000",
    }
    fields.update(extra)
    return fields


def test_record_from_queued_fields() -> None:
    s = build(priority="P0", est_s=0.4, preemptible=False)
    r = TaskRecord.from_fields(stored_fields(s))
    assert (r.id, r.handler, r.payload, r.model, r.vram_gb) == (s.task_id, "h", {"x": 1}, "A", 8.0)
    assert r.priority is Priority.P0 and r.state is State.QUEUED and r.preemptible is False
    assert r.enqueued_at == 1_700_000_000.0 and r.deadline is None
    assert r.worker is None and r.token is None and r.started_at is None
    assert r.finished_at is None and r.result is None and r.error is None


def test_record_round_trip_of_an_ended_task() -> None:
    s = build()
    fields = stored_fields(s, state="succeeded", worker="w1", token="7", attempt="2",
                           deadline="1700000002000", started_at="1700000001000",
                           finished_at="1700000001500", result='{"text":"hi"}', error="")
    r = TaskRecord.from_fields(fields)
    assert r.state is State.SUCCEEDED and r.worker == "w1" and r.token == 7 and r.attempt == 2
    assert (r.deadline, r.started_at, r.finished_at) == (1_700_000_002.0, 1_700_000_001.0,
                                                         1_700_000_001.5)
    assert r.result == {"text": "hi"} and r.error is None
    d = r.to_dict()
    assert d["priority"] == "P2" and d["state"] == "succeeded"
    assert json.loads(json.dumps(d)) == d  # plain JSON-able for --json output
    back = {**d, "priority": Priority.parse(d["priority"]), "state": State(d["state"])}
    assert TaskRecord(**back) == r


def test_generated_ids_grow_in_creation_order_and_stay_unique() -> None:
    ids = [build().task_id for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_ids_of_a_forked_child_differ_from_its_parents() -> None:
    """Both sides draw their next ids at the same count: the random part must differ."""
    new_task_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child writes its next ids and leaves at once
        os.write(write, " ".join(new_task_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    parent = [new_task_id() for _ in range(3)]
    assert [c[12:18] for c in child] == [p[12:18] for p in parent]  # same counts
    assert not {c[18:] for c in child} & {p[18:] for p in parent}


def test_a_states_ended_count_sums_its_counts_per_priority_and_unleveled() -> None:
    stats = {"succeeded:P0": "2", "succeeded:P3": "5", "succeeded:unleveled": "1",
             "succeeded": "99",  # a total kept by an older release: not counted again
             "failed:P1": "4"}
    assert ended_count(stats, "succeeded") == 8
    assert ended_count(stats, "failed") == 4 and ended_count(stats, "expired") == 0


def test_the_largest_bounds_pass_as_enqueue_lua_takes_them() -> None:
    s = build(vram_gb=1e6, est_s=1e10, deadline_s=1e10)
    assert (s.vram_gb, s.est_s, s.deadline_s) == (1e6, 1e10, 1e10)


@pytest.mark.parametrize("option", ["preemptible", "report_end", "after_any_outcome"])
@pytest.mark.parametrize("value", ["no", "", None, 2, [False]])
def test_a_yes_no_option_takes_a_bool_only(option: str, value: object) -> None:
    with pytest.raises(InvalidTask, match=option):
        build(**{option: value})
    assert getattr(build(**{option: 0}), option) is False


def test_after_none_means_no_parents_and_a_non_iterable_is_refused() -> None:
    assert build(after=None).after == ()
    with pytest.raises(InvalidTask, match="after must be task ids"):
        build(after=5)


@pytest.mark.parametrize("tasks", [None, "abc", {"handler": "h"}, 7])
def test_a_bulk_of_something_other_than_a_list_of_tasks_is_refused(tasks: object) -> None:
    with pytest.raises(InvalidTask, match="list of task mappings"):
        build_specs(tasks)  # type: ignore[arg-type]


def test_a_due_time_past_what_enqueue_takes_is_refused_with_its_bound() -> None:
    """The defect: at between 1e10 and 1e12 passed here, then the script refused it with a
    message about `after`, which the caller never gave."""
    assert build(at=9_999_999_999).at == 9_999_999_999
    with pytest.raises(InvalidTask, match=r"at must be epoch seconds up to 1e10, got 99999999999"):
        build(at=99_999_999_999)


def test_a_name_over_200_bytes_in_utf8_is_refused_by_the_client() -> None:
    """Found by a QA pass: the client counted characters, enqueue.lua counts bytes."""
    with pytest.raises(InvalidTask, match="longer than 200 bytes"):
        build(tenant="é" * 150)


def test_a_deadline_shorter_than_the_estimate_is_refused_before_anything_is_sent() -> None:
    """As enqueue.lua refuses it (test_expiry.py): a producer's own estimate that cannot meet
    its deadline is bad input, also for a schedule's runs; at the deadline exactly, taken."""
    with pytest.raises(InvalidTask, match="deadline_s 5 is shorter than est_s 30: it cannot end in time"):
        build(est_s=30, deadline_s=5)
    assert build(est_s=5, deadline_s=5).deadline_s == 5.0
    assert build(deadline_s=5).deadline_s == 5.0  # no estimate given: the pool's is judged later
