"""The access log's sampling, its request ids and the JSON line it makes (in-process)."""

from __future__ import annotations

import io
import json

from workerpool.logs import AccessLog, Ran, RequestIds


def test_errors_always_get_a_line_and_successes_one_in_every_n():
    sampled = AccessLog(sample=0.25)
    assert [sampled.wanted(False) for _ in range(8)] == [False, False, False, True] * 2
    for share, kept in ((0.7, 700), (0.4, 400), (0.1, 100), (1e-320, 0)):  # counted, never rounded to 1/N
        every = AccessLog(sample=share)
        assert sum(every.wanted(False) for _ in range(1000)) == kept
    assert all(sampled.wanted(True) for _ in range(3))
    errors_alone = AccessLog(sample=0)
    assert not any(errors_alone.wanted(False) for _ in range(100)) and errors_alone.wanted(True)
    off = AccessLog(on=False)
    assert not off.wanted(True) and not off.wanted(False)
    assert all(AccessLog().wanted(False) for _ in range(5))


def test_a_clients_id_is_kept_only_when_it_is_a_plain_token():
    ids = RequestIds()
    assert ids.chosen("trace-1:abc") == "trace-1:abc"
    made = [ids.chosen(given) for given in (None, "", "has space", "line\nbreak", "x" * 129, "é")]
    assert len(set(made)) == len(made) and all(id.count("-") == 1 for id in made)


def test_lines_are_held_until_the_turn_ends_then_written_at_once_in_either_format():
    lines = {}
    for log_format in ("text", "json"):
        stream = io.StringIO()
        access = AccessLog(log_format=log_format, stream=stream)
        access.write("http", "POST /embed", model="m", status=200, ran=Ran("ok", 0.0012, 0.0345, 77),
                     size_in=10, size_out=20, request_id="r-1")
        access.write("zmq", "infer", model="", status=429, ran=Ran("overloaded"), size_in=5, size_out=6,
                     request_id="r-2")
        assert stream.getvalue() == ""
        access.flush()
        lines[log_format] = stream.getvalue().splitlines()
    first, second = lines["text"]
    assert first.endswith(" INFO workerpool.access: http POST /embed 200 model=m code=ok in=10 out=20 "
                          "queue_ms=1.2 run_ms=34.5 worker=77 id=r-1")
    assert second.endswith("zmq infer 429 model=- code=overloaded in=5 out=6 queue_ms=- run_ms=- worker=- id=r-2")
    entry, refused = map(json.loads, lines["json"])
    assert {key: entry[key] for key in ("level", "logger", "door", "route", "status", "code", "model", "bytes_in",
                                        "bytes_out", "queue_ms", "run_ms", "worker", "request_id")} == {
        "level": "info", "logger": "workerpool.access", "door": "http", "route": "POST /embed", "status": 200,
        "code": "ok", "model": "m", "bytes_in": 10, "bytes_out": 20, "queue_ms": 1.2, "run_ms": 34.5, "worker": 77,
        "request_id": "r-1"}
    assert refused["model"] is None and refused["worker"] is None and refused["status"] == 429
    assert entry["time"].endswith("Z") and entry["message"] == first.split("workerpool.access: ")[1]
