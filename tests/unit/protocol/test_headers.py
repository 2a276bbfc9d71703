"""Header frames as the router, the workers and the HTTP front door read them."""

from __future__ import annotations

import pytest

from workerpool.protocol import messages as protocol

HEADER = '{"v":1,"id":7,"method":"infer","arrays":[]}'


@pytest.mark.parametrize("data", [
    HEADER.encode(), b"\xef\xbb\xbf" + HEADER.encode(), HEADER.encode("utf-16"),
    HEADER.encode("utf-32-le"), bytearray(HEADER.encode()), HEADER,
], ids=["utf-8", "utf-8 with a BOM", "utf-16", "utf-32", "bytearray", "str"])
def test_a_header_reads_in_every_encoding_json_allows(data):
    assert protocol.strict_json(data) == {"v": 1, "id": 7, "method": "infer", "arrays": []}


@pytest.mark.parametrize("data", [b'{"id":NaN}', b'{"id":1e999}', b"\xff\xfe\xfa", b'{"id":'])
def test_what_json_does_not_allow_is_a_protocol_error(data):
    with pytest.raises(protocol.ProtocolError, match="header is not valid JSON"):
        protocol.decode_header(data)


def test_encoding_is_compact_and_refuses_nan():
    assert protocol.encode_header({"id": 1, "a": [1, 2]}) == b'{"id":1,"a":[1,2]}'
    with pytest.raises(ValueError):
        protocol.encode_header({"id": float("nan")})
