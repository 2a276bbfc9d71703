"""Writing Burnpack files: Burn's exact bytes, property-based round trips, atomic failure."""

from __future__ import annotations

import math
import os
import struct

import cbor2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from workerpool import burnpack
from workerpool.burnpack import dtypes
from workerpool.burnpack.layout import TENSOR_ALIGNMENT


def metadata_blob(path) -> bytes:
    raw = path.read_bytes()
    size = int.from_bytes(raw[6:10], "little")
    return raw[10 : 10 + size]


def text(s: str) -> bytes:
    """CBOR text string (short form), as ciborium writes keys."""
    return bytes([0x60 + len(s)]) + s.encode()


# --- Burn's encoding ---------------------------------------------------------------------------


def test_scalar_encoding_matches_burn(tmp_path):
    """Scalars are serde newtype variants: one-entry maps, shortest ints and floats (section 1.2)."""
    path = tmp_path / "s.bpk"
    scalars = {"half": 0.5, "neg": -3, "five": 5, "big": 2**63, "milli": 0.001, "flag": True}
    burnpack.write(path, {}, scalars=scalars)
    blob = metadata_blob(path)
    assert b"\xa1" + text("Float") + b"\xf9\x38\x00" in blob
    assert b"\xa1" + text("Int") + b"\x22" in blob
    assert b"\xa1" + text("Int") + b"\x05" in blob
    assert b"\xa1" + text("UInt") + b"\x1b\x80\x00\x00\x00\x00\x00\x00\x00" in blob
    assert b"\xa1" + text("Float") + bytes.fromhex("fb3f50624dd2f1a9fc") in blob
    assert b"\xa1" + text("Bool") + b"\xf5" in blob
    document = cbor2.loads(blob)
    assert list(document) == ["tensors", "scalars"]
    assert list(document["scalars"]) == sorted(scalars)
    assert document["scalars"]["neg"] == {"Int": -3}
    pack = burnpack.read(path)
    assert dict(pack.scalars) == scalars
    assert type(pack.scalars["flag"]) is bool and type(pack.scalars["five"]) is int


@pytest.mark.parametrize(
    ("bits", "encoded"),
    [
        ("fff8000000000000", "f9fe00"),  # -NaN, what x86 arithmetic (inf - inf) produces
        ("7ff8000000000000", "f97e00"),  # NaN
        ("7ff8000000000001", "fb7ff8000000000001"),  # NaN whose payload only f64 holds
        ("8000000000000000", "f98000"),  # -0.0
        ("7ff0000000000000", "f97c00"),  # inf
        ("40effe0000000000", "fa477ff000"),  # 65520.0: rounds to inf in f16, exact in f32
        ("3e70000000000000", "f90001"),  # 2**-24, the smallest f16 subnormal
        ("3e60000000000000", "fa33000000"),  # 2**-25: below f16, exact in f32
    ],
)
def test_float_scalars_use_ciboriums_width(tmp_path, bits, encoded):
    """ciborium keeps the shortest width that round-trips the f64 *bits*, NaN sign included."""
    value = struct.unpack(">d", bytes.fromhex(bits))[0]
    path = tmp_path / "s.bpk"
    burnpack.write(path, {}, scalars={"x": value})
    assert b"\xa1" + text("Float") + bytes.fromhex(encoded) in metadata_blob(path)
    got = burnpack.read(path).scalars["x"]
    assert struct.pack(">d", got) == struct.pack(">d", value) or math.isnan(value)


def ciborium_float(value: float) -> bytes:
    """Reference for finite/infinite floats, via numpy: the first width that converts back exactly."""
    for head, dtype in ((b"\xf9", ">f2"), (b"\xfa", ">f4")):
        with np.errstate(over="ignore"):
            narrow = np.array([value]).astype(dtype)
        if narrow.astype(">f8").tobytes() == struct.pack(">d", value):
            return head + narrow.tobytes()
    return b"\xfb" + struct.pack(">d", value)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=False),
        st.floats(width=32, allow_nan=False),
        st.floats(width=16, allow_nan=False),
    )
)
def test_float_width_property(value):
    """For every non-NaN float the writer picks the same width and bytes as ciborium would."""
    from workerpool.burnpack.writer import _encode_float

    assert cbor2.dumps(value, encoders={float: _encode_float}) == ciborium_float(value)


def test_metadata_document_matches_burns_serde_layout(tmp_path):
    """Key order is serde's (struct fields in order, BTreeMap keys sorted by UTF-8 bytes)."""
    path = tmp_path / "m.bpk"
    names = ["z", "é", "Z", "a.b", "a", ""]
    burnpack.write(
        path,
        [(name, np.zeros(2, dtype="f4")) for name in names],
        metadata={"producer": "burn", "format": "burnpack"},
        param_ids={"a": 2**64 - 1, "z": 64},
    )
    blob = metadata_blob(path)
    document = cbor2.loads(blob)
    assert list(document) == ["tensors", "metadata"]
    assert list(document["tensors"]) == sorted(names, key=str.encode)
    assert list(document["metadata"]) == ["format", "producer"]
    assert list(document["tensors"]["a"]) == ["dtype", "shape", "data_offsets", "param_id"]
    assert list(document["tensors"]["Z"]) == ["dtype", "shape", "data_offsets"]
    assert b"\x68param_id\x18\x40" in blob  # 64 with the shortest head
    # Re-encoding with cbor2's defaults (definite lengths, shortest heads) gives the same bytes.
    assert cbor2.dumps(document) == blob


def test_alignment_padding_and_file_end(tmp_path):
    """Tensors of 3, 1 and 2 f32 sit at 0, 256 and 512 with zero gaps; the file ends at the last."""
    path = tmp_path / "a.bpk"
    values = [np.full(n, n, dtype="f4") for n in (3, 1, 2)]
    burnpack.write(path, [("c", values[0]), ("b", values[1]), ("a", values[2])])
    raw = path.read_bytes()
    pack = burnpack.read(path)
    d = pack.data_start
    assert d % TENSOR_ALIGNMENT == 0 and d == -(-(10 + len(metadata_blob(path))) // 256) * 256
    assert raw[10 + len(metadata_blob(path)) : d] == bytes(d - 10 - len(metadata_blob(path)))
    assert [pack.infos[n].offset - d for n in "cba"] == [0, 256, 512]
    assert raw[d + 12 : d + 256] == bytes(244) and raw[d + 260 : d + 512] == bytes(252)
    assert len(raw) == d + 512 + 8
    assert [i.name for i in pack.disk_order()] == ["c", "b", "a"]


def test_deferred_loaders_run_once_in_write_order(tmp_path):
    """Each Deferred is loaded exactly once, when the writer reaches it, in the order given."""
    calls = []

    def loader(name, n):
        def load():
            calls.append(name)
            return np.arange(n, dtype="f4")

        return load

    order = ["w3", "w1", "w2"]
    burnpack.write(
        tmp_path / "d.bpk", [(n, burnpack.Deferred(np.float32, (4,), loader(n, 4))) for n in order]
    )
    assert calls == order


# --- property-based round trips ----------------------------------------------------------------

NUMPY_CODES = ["<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "i1", "<u8", "<u4", "<u2", "u1", "?"]

scalar_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),  # NaN, infinities and -0.0 included
)


@st.composite
def packs(draw):
    names = draw(st.lists(st.text(max_size=10), unique=True, max_size=6))
    tensors = []
    for name in names:
        dtype = np.dtype(draw(st.sampled_from(NUMPY_CODES)))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
        tensors.append((name, draw(hnp.arrays(dtype, shape))))
    param_ids = {name: draw(st.integers(0, 2**64 - 1)) for name in names if draw(st.booleans())}
    metadata = draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
    scalars = draw(st.dictionaries(st.text(max_size=8), scalar_values, max_size=4))
    return tensors, param_ids, metadata, scalars


def same_scalar(got, want) -> bool:
    if type(got) is not type(want):
        return False
    if isinstance(want, float):
        if math.isnan(want):
            return math.isnan(got)
        return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    return got == want


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(packs())
def test_round_trip_property(tmp_path, pack_spec):
    """Whatever is written reads back identically, aligned, in Burn's layout and sorted order."""
    tensors, param_ids, metadata, scalars = pack_spec
    path = tmp_path / "p.bpk"
    burnpack.write(path, tensors, metadata=metadata, scalars=scalars, param_ids=param_ids)
    pack = burnpack.read(path)
    size = path.stat().st_size

    assert list(pack.tensors) == sorted(name for name, _ in tensors)
    assert pack.layout == "aligned"
    assert dict(pack.metadata) == metadata
    assert pack.scalars.keys() == scalars.keys()
    assert all(same_scalar(pack.scalars[k], v) for k, v in scalars.items())
    for name, array in tensors:
        info = pack.infos[name]
        got = pack.tensors[name]
        assert got.dtype == array.dtype.newbyteorder("<")
        assert got.shape == array.shape
        assert got.tobytes() == array.tobytes()
        assert info.param_id == param_ids.get(name)
        assert info.offset % TENSOR_ALIGNMENT == 0
    offsets = [pack.infos[name].offset for name, _ in tensors]
    assert offsets == sorted(offsets)  # disk order is write order
    ends = [info.offset + info.nbytes for info in pack.infos.values()]
    assert size == max(ends, default=pack.data_start)


# --- atomicity and refusals --------------------------------------------------------------------


def failing_load():
    raise RuntimeError("loader exploded")


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (burnpack.Deferred(np.float32, (4,), failing_load), RuntimeError),
        (
            burnpack.Deferred(np.float32, (4,), lambda: np.zeros((2, 2), dtype="f4")),
            burnpack.BurnpackError,
        ),
        (
            burnpack.Deferred(np.float32, (4,), lambda: np.zeros(5, dtype="f4")),
            burnpack.BurnpackError,
        ),
        (burnpack.Deferred(np.float32, (4,), lambda: [0.0] * 4), burnpack.BurnpackError),
    ],
    ids=["load-raises", "wrong-shape", "wrong-length", "not-an-array"],
)
def test_failed_write_leaves_destination_intact(tmp_path, bad, error):
    """A failure after tensors were written keeps the old file byte-intact and leaves no temp file."""
    path = tmp_path / "model.bpk"
    burnpack.write(path, {"old": np.arange(5, dtype="i4")})
    before = path.read_bytes()
    big_first = np.ones(100_000, dtype="f8")  # so the temporary file really holds data
    with pytest.raises(error):
        burnpack.write(path, [("first", big_first), ("bad", bad), ("never", np.zeros(1, "f4"))])
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.bpk"]


def test_failed_write_creates_nothing(tmp_path):
    """Without a previous file, a failed write leaves the directory empty."""
    with pytest.raises(RuntimeError):
        burnpack.write(
            tmp_path / "m.bpk", {"bad": burnpack.Deferred(np.float32, (4,), failing_load)}
        )
    assert os.listdir(tmp_path) == []


def test_success_leaves_no_temporary_file(tmp_path):
    burnpack.write(tmp_path / "m.bpk", {"w": np.ones(3, dtype="f4")})
    burnpack.write(tmp_path / "m.bpk", {"w": np.ones(4, dtype="f4")})
    assert os.listdir(tmp_path) == ["m.bpk"]


def test_duplicate_names_rejected(tmp_path):
    """Burn's writer refuses two tensors with one name; nothing is written."""
    with pytest.raises(burnpack.BurnpackError, match="'w'"):
        burnpack.write(tmp_path / "m.bpk", [("w", np.ones(1, "f4")), ("w", np.ones(2, "f4"))])
    assert os.listdir(tmp_path) == []


def test_missing_directory_is_a_burnpack_error(tmp_path):
    path = tmp_path / "no" / "such" / "m.bpk"
    with pytest.raises(burnpack.BurnpackError) as info:
        burnpack.write(path, {"w": np.ones(1, "f4")})
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert os.listdir(tmp_path) == []


QFLOAT = burnpack.qfloat({"value": "Q8S", "store": "Native", "mode": "Symmetric"})

REFUSED = {
    "complex-dtype": {"tensors": {"w": np.ones(2, dtype="c8")}},
    "object-dtype": {"tensors": {"w": np.array([None], dtype=object)}},
    "datetime-dtype": {"tensors": {"w": np.array(["2024-01-01"], dtype="M8[D]")}},
    "list-not-array": {"tensors": {"w": [1.0, 2.0]}},
    "non-text-name": {"tensors": [(3, np.ones(1, "f4"))]},
    "qfloat-without-nbytes": {"tensors": {"q": burnpack.Deferred(QFLOAT, (4,), lambda: None)}},
    "nbytes-contradicts-shape": {
        "tensors": {"w": burnpack.Deferred(np.float32, (4,), lambda: None, nbytes=15)}
    },
    "param-id-negative": {"tensors": {"w": np.ones(1, "f4")}, "param_ids": {"w": -1}},
    "param-id-over-u64": {"tensors": {"w": np.ones(1, "f4")}, "param_ids": {"w": 2**64}},
    "param-id-bool": {"tensors": {"w": np.ones(1, "f4")}, "param_ids": {"w": True}},
    "scalar-over-u64": {"tensors": {}, "scalars": {"s": 2**64}},
    "scalar-below-i64": {"tensors": {}, "scalars": {"s": -(2**63) - 1}},
    "scalar-text": {"tensors": {}, "scalars": {"s": "1.0"}},
    "scalar-name-not-text": {"tensors": {}, "scalars": {1: 1.0}},
    "metadata-value-not-text": {"tensors": {}, "metadata": {"k": 1}},
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_invalid_input_refused_before_writing(tmp_path, case):
    """Inputs Burn cannot represent (or that its reader would refuse) fail with BurnpackError."""
    kwargs = dict(REFUSED[case])
    with pytest.raises(burnpack.BurnpackError) as info:
        burnpack.write(tmp_path / "m.bpk", kwargs.pop("tensors"), **kwargs)
    assert "\n" not in str(info.value)
    assert os.listdir(tmp_path) == []


def test_dtype_table_is_complete():
    """Every DType spelling of section 2 is known, with Burn's serde encoding and element size."""
    sizes = {
        "F64": 8, "F32": 4, "Flex32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
        "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
        "Bool(Native)": 1, "Bool(U8)": 1, "Bool(U32)": 4,
    }  # fmt: skip
    assert {name: dtype.itemsize for name, dtype in dtypes.BY_NAME.items()} == sizes
    for name, dtype in dtypes.BY_NAME.items():
        assert dtypes.from_cbor(dtype.to_cbor()) == dtype
        assert dtypes.from_cbor(cbor2.loads(cbor2.dumps(dtype.to_cbor()))).name == name
    assert dtypes.BY_NAME["Bool(U32)"].to_cbor() == {"Bool": "U32"}


def test_deferred_loader_of_the_wrong_dtype_is_refused(tmp_path):
    """int32 bits must not be written under an F32 label just because the sizes agree."""
    out = tmp_path / "w.bpk"
    wrong = burnpack.Deferred(np.float32, (3,), lambda: np.arange(3, dtype=np.int32))
    with pytest.raises(burnpack.BurnpackError, match="got a int32 array, declared F32"):
        burnpack.write(out, {"w": wrong})
    assert not out.exists() and list(tmp_path.iterdir()) == []
