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
    texts = read_route(route_of(["a", "bé", "c"]))
    assert (texts.form, texts.count, texts.deadline, texts.text_lengths()) == (Form.TEXTS, 3, None, (1, 3, 1))
    info = read_route(route_of(None, method="info"))
    assert (info.method, info.form, len(info.frame), info.model) == ("info", Form.ALONE, HEAD.size, b"")
    named = read_route(route_of(None, method="info", model="embed.v2"))
    assert (named.model, len(named.frame)) == (b"embed.v2", HEAD.size + 8)
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
    (b"", "shorter than its 17-byte head"),
    (b"\x02" + bytes(15), "unsupported protocol version 2 .*run the same workerpool release"),
    (HEAD.pack(4, 0, 0, 0, 0, 0.0, 0), "unsupported protocol version 4"),
    (HEAD.pack(3, 2, 0, 0, 0, 0.0, 0), "method 2"),
    (HEAD.pack(3, 0, 4, 0, 0, 0.0, 0), "form 4"),
    (HEAD.pack(3, 0, 0, 2, 0, 0.0, 0), "flags 2"),
    (HEAD.pack(3, 0, 0, 1, 0, -1.0, 0), "deadline_ms"),
    (HEAD.pack(3, 0, 0, 1, 0, float("nan"), 0), "deadline_ms"),
    (HEAD.pack(3, 0, 0, 1, 0, float("inf"), 0), "deadline_ms"),
    (HEAD.pack(3, 0, 0, 0, 0, 0.0, 3) + b"a b", "model name b'a b' is not"),
    (HEAD.pack(3, 0, 0, 0, 0, 0.0, 9) + b"abc", "model name"),
    (HEAD.pack(3, 0, 0, 0, 0, 0.0, 2) + b"\xff\xfe", "model name"),
    (HEAD.pack(3, 0, 1, 0, 2, 0.0, 0) + b"<f4\0" + struct.pack("<Q", 1), "2 axes"),
    (HEAD.pack(3, 0, 1, 0, 33, 0.0, 0) + bytes(4 + 33 * 8), "33 axes"),
    (HEAD.pack(3, 0, 2, 0, 0, 0.0, 0), "0 texts"),
    (HEAD.pack(3, 0, 2, 0, 1025, 0.0, 0) + bytes(4 * 1025), "1025 texts"),
    (HEAD.pack(3, 0, 2, 0, 2, 0.0, 0) + bytes(4), "2 texts is 21 bytes"),
    (HEAD.pack(3, 0, 0, 0, 0, 0.0, 0) + b"x", "18 bytes"),
    (HEAD.pack(3, 0, 1, 0, 1, 0.0, 0) + b"text" + struct.pack("<Q", 1), "dtype b'text' is not one of"),
    (HEAD.pack(3, 0, 1, 0, 0, 0.0, 0) + b">f4\0", "dtype b'>f4"),
    (b"\xef\xbb\xbf" + b'{"v":1,"id":1}', "protocol version 1"),
    (b'\n {"v":1,"id":1}', "protocol version 1"),
    (HEAD.pack(3, 0, 1, 0, 1, 0.0, 0) + b"<f4\0" + bytes(8) + b"n" * 70_000, "over the 65536-byte limit"),
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
    lies.append(route_of(np.zeros((3, 4), np.float32), deadline_ms=1000 / 3, model="other"))
    for lie in lies:
        with pytest.raises(protocol.ProtocolError, match="route frame does not repeat|texts") as caught:
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
    header = {"v": 3, "id": 3, "method": "infer", "arrays": [{"dtype": "<f4", "shape": [1, 2], "name": None}]}
    frames = [route_for(header), json.dumps(header).encode(), bytes(8)]
    assert route_for(header) == route_of(np.zeros((1, 2), np.float32))
    assert protocol.decode_request(frames).id == 3


def test_route_for_matches_what_a_header_says():
    header = {"v": 3, "id": 1, "method": "infer", "arrays": [{"dtype": "|u1", "shape": [2, 3], "name": "é"}],
              "deadline_ms": 5, "model": "m1"}
    route = read_route(route_for(header))
    assert (route.count, route.deadline, route.first_axis(), route.model) == (2, 0.005, 2, b"m1")
    assert route.frame.endswith("é".encode()) and route.frame[19:23] == b"|u1\0"
    assert json.loads(protocol.encode_request(1, np.zeros((2, 3), np.uint8))[2])["arrays"][0]["dtype"] == "|u1"


def test_texts_travel_in_one_frame_cut_by_the_lengths_the_route_frame_gives():
    frames = protocol.encode_request(5, ["a", "é", "", "zz"])[1:]
    assert json.loads(frames[1])["texts"] == 4 and bytes(frames[2]) == "aézz".encode()
    assert protocol.decode_request(frames).texts == ["a", "é", "", "zz"]
    part = protocol.decode_request([frames[0], frames[1], "é".encode()], (1, 3))
    assert (part.texts, part.first) == (["é", ""], 1)
    for frame, words in (([frames[0], frames[1], b"a\xc3\xa9"], "add up to 5 bytes; their frame has 3"),
                         ([frames[0], frames[1], b"a\xff\xfezz"], "not valid UTF-8"),
                         ([frames[0], frames[1], frames[2], b""], "one frame after its header")):
        with pytest.raises(protocol.ProtocolError, match=words):
            protocol.decode_request(frame)
    with pytest.raises(protocol.ProtocolError, match="rows \\[3, 5\\]"):
        protocol.decode_request(frames, (3, 5))
    header = json.loads(frames[1])
    header["text"] = ["a"]
    with pytest.raises(protocol.ProtocolError, match="since protocol version 3"):
        protocol.decode_request([frames[0], json.dumps(header).encode(), frames[2]])


def test_a_part_of_an_array_request_is_its_rows():
    array = np.arange(12, dtype=np.float32).reshape(4, 3)
    frames = protocol.encode_request(5, array)[1:]
    part = protocol.decode_request([frames[0], frames[1], array[1:3].tobytes()], (1, 3))
    assert np.array_equal(part.arrays[0], array[1:3]) and part.first == 1
    with pytest.raises(protocol.ProtocolError, match="needs 24 bytes"):
        protocol.decode_request([frames[0], frames[1], array[1:2].tobytes()], (1, 3))


def test_a_model_name_is_checked_before_it_is_sent():
    with pytest.raises(protocol.ProtocolError, match="cannot name a model"):
        protocol.encode_request(1, None, model="../etc")


def test_the_replies_of_a_requests_parts_are_one_reply():
    a = protocol.encode_reply(7, {"e": np.ones((2, 3), np.float32), "t": np.array([1, 2], np.int32)},
                              worker_pid=1, generation=4)
    b = protocol.encode_reply(7, {"e": np.zeros((1, 3), np.float32), "t": np.array([3], np.int32)},
                              worker_pid=2, generation=4)
    merged = protocol.decode_reply(protocol.merge_replies([a, b]))
    assert merged.id == 7 and merged.header["generation"] == 4
    assert merged.payload()["e"].shape == (3, 3) and list(merged.payload()["t"]) == [1, 2, 3]
    other = protocol.encode_reply(7, {"e": np.zeros((1, 4), np.float32), "t": np.array([3], np.int32)})
    with pytest.raises(protocol.ProtocolError, match="different outputs"):
        protocol.merge_replies([a, other])
