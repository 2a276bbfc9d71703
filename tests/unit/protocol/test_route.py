"""Route frames: what the client writes, what the router reads of it, what the worker checks."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from workerpool.codecs.http_call import KSERVE, request_frames
from workerpool.protocol import messages as protocol
from workerpool.protocol.route import HEAD, Form, read_route, route_for
from workerpool.router.batching import HTTP_SHAPE, TEXT_KEY, BatchPolicy


def route_of(payload, **options) -> bytes:
    return protocol.encode_request(1, payload, **options)[1]


def test_a_route_frame_says_method_form_count_and_deadline():
    rows = read_route(route_of(np.zeros((3, 4), np.float32), deadline_ms=250))
    assert (rows.method, rows.form, rows.count, rows.deadline, rows.first_axis()) == ("infer", Form.ARRAY, 2, 0.25, 3)
    texts = read_route(route_of(["a", "b", "c"]))
    assert (texts.form, texts.count, texts.deadline) == (Form.TEXTS, 3, None)
    info = read_route(route_of(None, method="info"))
    assert (info.method, info.form, len(info.frame)) == ("info", Form.ALONE, HEAD.size)
    named = read_route(route_of({"a": np.zeros(2, np.int8), "b": np.zeros(2, np.int8)}))
    assert named.form == Form.ALONE
    http = read_route(request_frames(1, KSERVE, "m", b"{}", head=None, deadline=None)[0])
    assert http.form == Form.HTTP


def test_the_router_batches_by_the_route_frame_alone():
    """A bare row and a batch of rows stack; another dtype, name or width does not."""
    policy = BatchPolicy(max_rows=8, rank=2, text=True)

    def shape(payload):
        frames = protocol.encode_request(1, payload)[1:]
        return policy.shape_of(read_route(frames[0]), len(frames))

    batch = shape(np.zeros((3, 4), np.float32))
    assert batch.rows == 3 and shape(np.zeros(4, np.float32)) == (batch.key, 1)
    assert shape(np.zeros((0, 4), np.float32)) == (batch.key, 1)  # an empty request is a row
    others = [shape(np.zeros((3, 5), np.float32)), shape(np.zeros((3, 4), np.float64)),
              shape({"input": np.zeros((3, 4), np.float32)})]
    assert all(other is not None and other.key != batch.key for other in others)
    assert shape(np.zeros((1, 2, 4), np.float32)) is None  # not the model's rank
    assert shape(["a", "b"]) == (TEXT_KEY, 2)
    frames = request_frames(1, KSERVE, "m", b"{}", head=None, deadline=None)
    assert policy.shape_of(read_route(frames[0]), len(frames)) == HTTP_SHAPE
    one_array = protocol.encode_request(1, np.zeros((3, 4), np.float32))[1:]
    assert policy.shape_of(read_route(one_array[0]), len(one_array) + 1) is None  # a frame more: alone
    info = protocol.encode_request(1, None, method="info")[1:]
    assert policy.shape_of(read_route(info[0]), len(info)) is None


@pytest.mark.parametrize("frame, words", [
    (b'{"v":1,"id":1,"method":"info"}', "protocol version 1"),
    (b"", "shorter than its 16-byte head"),
    (HEAD.pack(3, 0, 0, 0, 0, 0.0), "unsupported protocol version 3"),
    (HEAD.pack(2, 2, 0, 0, 0, 0.0), "method 2"),
    (HEAD.pack(2, 0, 4, 0, 0, 0.0), "form 4"),
    (HEAD.pack(2, 0, 0, 2, 0, 0.0), "flags 2"),
    (HEAD.pack(2, 0, 0, 1, 0, -1.0), "deadline_ms"),
    (HEAD.pack(2, 0, 0, 1, 0, float("nan")), "deadline_ms"),
    (HEAD.pack(2, 0, 0, 1, 0, float("inf")), "deadline_ms"),
    (HEAD.pack(2, 0, 1, 0, 2, 0.0) + b"<f4\0" + struct.pack("<Q", 1), "2 axes"),
    (HEAD.pack(2, 0, 1, 0, 33, 0.0) + bytes(4 + 33 * 8), "33 axes"),
    (HEAD.pack(2, 0, 2, 0, 0, 0.0), "count 0"),
    (HEAD.pack(2, 0, 2, 0, 1025, 0.0), "count 1025"),
    (HEAD.pack(2, 0, 0, 0, 0, 0.0) + b"x", "17 bytes"),
    (HEAD.pack(2, 0, 1, 0, 1, 0.0) + b"text" + struct.pack("<Q", 1), "dtype b'text' is not one of"),
    (HEAD.pack(2, 0, 1, 0, 0, 0.0) + b">f4\0", "dtype b'>f4"),
    (b"\xef\xbb\xbf" + b'{"v":1,"id":1}', "protocol version 1"),
    (b'\n {"v":1,"id":1}', "protocol version 1"),
    (HEAD.pack(2, 0, 1, 0, 1, 0.0) + b"<f4\0" + bytes(8) + b"n" * 70_000, "over the 65536-byte limit"),
])
def test_a_malformed_route_frame_is_a_protocol_error(frame, words):
    with pytest.raises(protocol.ProtocolError, match=words):
        read_route(frame)


def test_the_worker_refuses_a_route_frame_that_differs_from_its_header():
    """A lie about rows (past --max-batch), dtype, name or method fails its request, naming it;
    the deadline is the sender's own (the worker reads the header's), so a float64 that is not
    the very one its decimal gives is no lie."""
    three = protocol.encode_request(9, np.zeros((3, 4), np.float32), deadline_ms=1000 / 3)[1:]
    lies = [route_of(np.zeros((1, 4), np.float32), deadline_ms=1000 / 3),
            route_of(np.zeros((3, 4), np.float64), deadline_ms=1000 / 3),
            route_of(np.zeros((3, 4), np.float32), deadline_ms=1000 / 3, method="info"),
            route_of({"x": np.zeros((3, 4), np.float32)}, deadline_ms=1000 / 3),
            route_of(["a", "b", "c"])]
    for lie in lies:
        with pytest.raises(protocol.ProtocolError, match="route frame does not repeat") as caught:
            protocol.decode_request([lie, *three[1:]])
        assert caught.value.request_id == 9
    header = json.loads(three[1])
    header["deadline_ms"] = 333.333333  # as a client printing six decimals writes it
    assert protocol.decode_request([three[0], json.dumps(header).encode(), three[2]]).arrays[0].shape == (3, 4)
    assert protocol.decode_request([route_of(np.zeros((3, 4), np.float32)), *three[1:]]).id == 9


def test_an_array_key_is_never_another_forms_key():
    """The form leads every array's key: no dtype, name or axes a client writes can make an
    array stack with texts or HTTP bodies, whose batches have another stride."""
    policy = BatchPolicy(max_rows=8, rank=1, text=True)
    for payload in (np.zeros(1, np.float32), np.zeros(4, np.uint8)):
        frames = protocol.encode_request(1, payload)[1:]
        key = policy.shape_of(read_route(frames[0]), len(frames)).key
        assert key.startswith(bytes([Form.ARRAY])) and key not in (TEXT_KEY, HTTP_SHAPE.key)


def test_a_null_name_is_no_name():
    header = {"v": 2, "id": 3, "method": "infer", "arrays": [{"dtype": "<f4", "shape": [1, 2], "name": None}]}
    frames = [route_for(header), json.dumps(header).encode(), bytes(8)]
    assert route_for(header) == route_of(np.zeros((1, 2), np.float32))
    assert protocol.decode_request(frames).id == 3


def test_route_for_matches_what_a_header_says():
    header = {"v": 2, "id": 1, "method": "infer", "arrays": [{"dtype": "|u1", "shape": [2, 3], "name": "é"}],
              "deadline_ms": 5}
    route = read_route(route_for(header))
    assert (route.count, route.deadline, route.first_axis()) == (2, 0.005, 2)
    assert route.frame.endswith("é".encode()) and route.frame[16:20] == b"|u1\0"
    assert json.loads(protocol.encode_request(1, np.zeros((2, 3), np.uint8))[2])["arrays"][0]["dtype"] == "|u1"
