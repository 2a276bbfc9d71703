"""HTTP/1.1 framing without a socket: bytes in, requests or refusals out. Each framing attack a
smuggler would try is refused, and a refusal never lets a later byte start a request."""

from __future__ import annotations

import pytest

from workerpool.gateway.http11 import (
    MAX_HEAD_BYTES,
    Refusal,
    Request,
    RequestReader,
    response,
    response_head,
)

MAX_BODY = 1000


def reader(admit=lambda request: 0) -> RequestReader:
    return RequestReader(MAX_BODY, admit, lambda request, size: None)


def read(data: bytes, *, split: int | None = None) -> RequestReader:
    parsing = reader()
    for part in ([data] if split is None else [data[i:i + split] for i in range(0, len(data), split)]):
        parsing.feed(part)
    return parsing


def test_a_request_in_pieces_of_one_byte_is_read_whole() -> None:
    data = b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello"
    parsing = read(data, split=1)
    assert parsing.refusal is None and len(parsing.ready) == 1
    request = parsing.ready[0]
    assert (request.method, request.path, request.body, request.keep_alive) == ("POST", "/v2/models/m/infer",
                                                                               b"hello", True)
    assert request.headers["x-a"] == "1, 2" and request.content_length == 5


def test_a_hundred_pipelined_requests_in_one_write_come_out_in_order() -> None:
    data = b"".join(b"POST /r HTTP/1.1\r\nContent-Length: %d\r\n\r\n%d" % (len(str(i)), i) for i in range(100))
    parsing = read(data)
    assert [request.body for request in parsing.ready] == [str(i).encode() for i in range(100)]


def test_a_chunked_body_is_joined() -> None:
    parsing = read(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert parsing.ready[0].body == b"abcde" and parsing.ready[0].chunked


@pytest.mark.parametrize("data, status, words", [
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, "Duplicate"),
    (b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\nabc", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 0x3\r\n\r\nabc", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400, "overflow"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 501, "Transfer-Encoding"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400, "Transfer-Encoding"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501, "gzip"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400, "header"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nab\r\n", 400, "overflow"),
    (b"GET / HTTP/1.1\nHost: x\n\n", 400, "CRLF"),
    (b"GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", 400, "CR"),
    (b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400, "whitespace"),
    (b"GET http://elsewhere/v2 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "not a path"),
    (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "not a path"),
    (b"GET /v2\x00x HTTP/1.1\r\nHost: x\r\n\r\n", 400, "url"),
    (b"GET /v2\rx HTTP/1.1\r\nHost: x\r\n\r\n", 400, "CRLF"),
    (b"GET /\r\n\r\n", 505, "HTTP/0.9"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "HTTP/2"),
    (b"GARBAGE\x00\x01\r\n\r\n", 400, "malformed"),
])
def test_framing_attacks_are_refused_and_nothing_after_them_is_read(data: bytes, status: int, words: str) -> None:
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    parsing = read(data + smuggled)
    assert parsing.refusal is not None, data
    assert (parsing.refusal.status, words.lower() in parsing.refusal.message.lower()) == (status, True), \
        parsing.refusal.message
    assert all(request.path != "/smuggled" for request in parsing.ready)
    parsing.feed(smuggled)
    assert all(request.path != "/smuggled" for request in parsing.ready)


def test_http_1_0_is_served_and_closes_unless_kept_alive() -> None:
    assert read(b"GET / HTTP/1.0\r\n\r\n").ready[0].keep_alive is False
    assert read(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").ready[0].keep_alive is True
    assert read(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").ready[0].keep_alive is False


def test_heads_and_bodies_past_their_limits_are_refused_before_they_are_held() -> None:
    many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n"
    assert read(many).refusal.message == "more than 100 headers"
    assert "over 8190 bytes" in read(b"GET / HTTP/1.1\r\nX: " + b"v" * 9000 + b"\r\n\r\n").refusal.message
    assert "target is over" in read(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n").refusal.message
    endless = reader()
    for _ in range(MAX_HEAD_BYTES // 1000 + 2):  # a header value that never ends
        endless.feed(b"X" * 1000)
        if endless.refusal:
            break
    assert endless.refusal is not None and endless.refusal.status == 400
    announced = read(b"POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n")
    assert announced.refusal.status == 413 and "1001 bytes" in announced.refusal.message
    chunks = read(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"100\r\n" + b"a" * 256 + b"\r\n" * 1
                  + b"".join(b"100\r\n" + b"a" * 256 + b"\r\n" for _ in range(4)))
    assert chunks.refusal.status == 413 and not chunks.ready


def test_admit_sees_each_head_before_its_body_and_may_refuse_it() -> None:
    seen: list[Request] = []

    def admit(request: Request) -> int:
        seen.append(request)
        if request.path == "/no":
            raise Refusal(503, "full", headers={"Retry-After": "1"})
        return 7

    parsing = RequestReader(MAX_BODY, admit, lambda request, size: None)
    parsing.feed(b"POST /yes HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert [r.path for r in seen] == ["/yes"] and parsing.continue_wanted and not parsing.ready
    assert parsing.partial is not None and parsing.partial.reserved == 7 and parsing.in_body
    parsing.feed(b"okPOST /no HTTP/1.1\r\nContent-Length: 2\r\n\r\nno")
    assert [r.body for r in parsing.ready] == [b"ok"]
    assert parsing.refusal.status == 503 and parsing.refusal.headers == {"Retry-After": "1"}


def test_an_upgrade_is_served_as_http_1_1_with_its_body_and_nothing_after_it_is_read() -> None:
    parsing = read(b"GET /v2 HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nGET /later HTTP/1.1\r\n\r\n")
    assert [r.path for r in parsing.ready] == ["/v2"] and parsing.upgraded
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n" \
        b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nContent-Length: 11\r\n\r\n"
    for split in (None, 1):
        posted = read(head + b'{"inputs":1}GET /later HTTP/1.1\r\n\r\n', split=split)
        assert [(r.path, r.body) for r in posted.ready] == [("/v2/models/m/infer", b'{"inputs":1')]


def test_trailers_are_never_read_as_headers() -> None:
    parsing = read(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
                   b"Authorization: Bearer stolen\r\nTimeout: 0\r\n\r\n")
    assert parsing.ready[0].body == b"{}" and "authorization" not in parsing.ready[0].headers


def test_a_long_head_is_refused_whether_it_comes_in_one_write_or_many() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70)) + b"\r\n"
    for split in (None, 4096):
        assert "head is over" in read(head, split=split).refusal.message


def test_a_chunked_body_is_counted_as_it_comes_and_may_be_refused() -> None:
    grown: list[int] = []

    def grow(request, size):
        grown.append(size)
        if sum(grown) > 4:
            raise Refusal(503, "full")

    parsing = RequestReader(MAX_BODY, lambda request: 0, grow)
    parsing.feed(b"POST /v1/embeddings HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    assert grown == [3] and parsing.refusal is None
    parsing.feed(b"3\r\ndef\r\n0\r\n\r\n")
    assert parsing.refusal.status == 503 and parsing.refusal.path == "/v1/embeddings" and not parsing.ready


def test_100_continue_is_owed_only_for_a_body_not_yet_sent() -> None:
    assert not read(b"GET /v2 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").continue_wanted
    waiting = read(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert waiting.continue_wanted
    waiting.feed(b"{}")
    assert not waiting.continue_wanted and waiting.ready[0].body == b"{}"


def test_responses_carry_their_length_and_a_head_answer_no_body() -> None:
    whole = response(429, b'{"e":1}', headers={"Retry-After": "1", "Connection": "keep-alive"}, close=True)
    assert whole == (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
                     b"Retry-After: 1\r\nConnection: close\r\n\r\n{\"e\":1}")
    assert response_head(200, 3).endswith(b"Content-Length: 3\r\n\r\n")


def test_a_refusal_after_the_head_names_the_path_it_answers():
    too_big = read(b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 5000\r\n\r\n")
    assert too_big.refusal.status == 413 and too_big.refusal.path == "/v1/embeddings"
    chunked = read(b"POST /v1/embeddings HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"".join(b"100\r\n" + b"a" * 256 + b"\r\n" for _ in range(5)))
    assert chunked.refusal.status == 413 and chunked.refusal.path == "/v1/embeddings"
    assert read(b"GET /\r\n\r\n").refusal.path is None
