"""The access log's sampling, its request ids and the JSON line it makes (in-process)."""

from __future__ import annotations

import json
import logging

from workerpool.logs import ACCESS_LOGGER, AccessLog, JsonFormatter, Ran, RequestIds


def test_errors_always_get_a_line_and_successes_one_in_every_n():
    sampled = AccessLog(sample=0.25)
    assert [sampled.wanted(False) for _ in range(8)] == [False, False, False, True] * 2
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


def test_a_json_line_holds_every_field(caplog):
    logger = logging.getLogger(ACCESS_LOGGER)
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    AccessLog().write("http", "POST /embed", model="m", status=200, ran=Ran("ok", 0.0012, 0.0345, 77),
                      size_in=10, size_out=20, request_id="r-1")
    record = caplog.records[-1]
    assert record.name == logger.name and record.getMessage() == (
        "http POST /embed 200 model=m code=ok in=10 out=20 queue_ms=1.2 run_ms=34.5 worker=77 id=r-1")
    entry = json.loads(JsonFormatter().format(record))
    assert {key: entry[key] for key in ("door", "route", "status", "code", "model", "bytes_in", "bytes_out",
                                        "queue_ms", "run_ms", "worker", "request_id")} == {
        "door": "http", "route": "POST /embed", "status": 200, "code": "ok", "model": "m", "bytes_in": 10,
        "bytes_out": 20, "queue_ms": 1.2, "run_ms": 34.5, "worker": 77, "request_id": "r-1"}
