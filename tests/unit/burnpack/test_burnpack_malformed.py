"""A battery of malformed files, one defect each, across every region of the format.

Each must fail with a single-line BurnpackError naming the file, and nothing else may escape:
no KeyError/TypeError from half-validated CBOR, no RecursionError, no giant allocation.
"""

from __future__ import annotations

import os
import stat

import cbor2
import numpy as np
import pytest
from support.bpk_builder import build, cbor_head, cbor_text, descriptor, header

from workerpool import burnpack
from workerpool.burnpack.layout import MAX_METADATA_SIZE, MAX_TENSOR_COUNT, MAX_TENSOR_SIZE

F32x4 = np.arange(4, dtype="<f4").tobytes()


def one(desc: dict, data: bytes = F32x4, **top) -> bytes:
    """A file with a single tensor 'w' described by ``desc``."""
    return build({"tensors": {"w": desc}, **top}, data)


def raw_metadata(blob: bytes, data: bytes = b"") -> bytes:
    return build(blob, data)


def deep_nesting(levels: int) -> bytes:
    """{"tensors": {}, "metadata": [[[...0...]]]}, nested ``levels`` deep."""
    return raw_metadata(
        cbor_head(5, 2) + cbor_text("tensors") + b"\xa0" + cbor_text("metadata")
        + b"\x81" * levels + b"\x00"
    )  # fmt: skip


def duplicated_dtype_field() -> bytes:
    """A descriptor with two "dtype" keys, which serde refuses (cbor2 dicts cannot express it)."""
    desc = (
        cbor_head(5, 4)
        + cbor_text("dtype") + cbor_text("F32")
        + cbor_text("dtype") + cbor_text("F32")
        + cbor_text("shape") + cbor_head(4, 1) + cbor_head(0, 4)
        + cbor_text("data_offsets") + cbor_head(4, 2) + cbor_head(0, 0) + cbor_head(0, 16)
    )  # fmt: skip
    return raw_metadata(
        cbor_head(5, 1) + cbor_text("tensors") + cbor_head(5, 1) + cbor_text("w") + desc, F32x4
    )


def too_many_tensors() -> bytes:
    """MAX_TENSOR_COUNT + 1 empty tensors, encoded directly rather than through a 100k-entry dict."""
    count = MAX_TENSOR_COUNT + 1
    desc = cbor2.dumps(descriptor("F32", [0], (0, 0)))
    entries = b"".join(cbor_text(f"t{i:06d}") + desc for i in range(count))
    return raw_metadata(cbor_head(5, 1) + cbor_text("tensors") + cbor_head(5, count) + entries)


def valid_blob() -> bytes:
    return cbor2.dumps({"tensors": {"w": descriptor("F32", [4], (0, 16))}, "metadata": {"a": "b"}})


QFLOAT_OK = {"value": "Q8S", "store": "Native", "mode": "Symmetric"}

# id -> (file bytes, or a function making them; a fragment the message must contain, which
# shows that the intended check fired rather than some other one)
CASES = {
    # --- header ---
    "empty-file": (b"", "too short"),
    "short-4-bytes": (b"NRUB", "too short"),
    "short-9-bytes": (header(0)[:9], "too short"),
    "bad-magic": (build(magic=0xDEADBEEF), "magic"),
    "version-2": (build(version=2), "version 2"),
    "metadata-size-over-limit": (header(MAX_METADATA_SIZE + 1) + bytes(64), "limit"),
    "metadata-size-u32-max": (header(2**32 - 1) + bytes(64), "limit"),
    "metadata-size-past-eof": (header(4096) + bytes(100), "past the end"),
    # --- metadata CBOR body ---
    "garbage-cbor": (raw_metadata(b"\xff\xfe\xfd\xfc"), "CBOR"),
    "truncated-cbor": (raw_metadata(valid_blob()[:40]), "CBOR"),
    "invalid-utf8-name": (raw_metadata(b"\xa1\x67tensors\xa1\x62\xff\xfe\xa0"), "CBOR"),
    "top-level-array": (build([{"tensors": {}}]), "not a map"),
    "top-level-int": (build(7), "not a map"),
    "missing-tensors-key": (build({"metadata": {}}), "tensors"),
    "tensors-not-a-map": (build({"tensors": [1, 2]}), "tensors"),
    "tensor-name-not-text": (build({"tensors": {7: descriptor()}}, F32x4), "tensors"),
    "metadata-not-a-map": (build({"tensors": {}, "metadata": ["a", "b"]}), "text to text"),
    "metadata-value-not-text": (build({"tensors": {}, "metadata": {"k": 1}}), "text to text"),
    "metadata-key-not-text": (build({"tensors": {}, "metadata": {b"k": "v"}}), "text to text"),
    "scalars-not-a-map": (build({"tensors": {}, "scalars": [1]}), "scalars"),
    "scalar-unknown-variant": (build({"tensors": {}, "scalars": {"s": {"Double": 1.0}}}), "'s'"),
    "scalar-bare-value": (build({"tensors": {}, "scalars": {"s": 1.0}}), "'s'"),
    "scalar-int-is-float": (build({"tensors": {}, "scalars": {"s": {"Int": 1.5}}}), "'s'"),
    "scalar-int-over-i64": (build({"tensors": {}, "scalars": {"s": {"Int": 2**63}}}), "'s'"),
    "scalar-bool-is-int": (build({"tensors": {}, "scalars": {"s": {"Bool": 1}}}), "'s'"),
    "scalar-name-not-text": (build({"tensors": {}, "scalars": {3: {"Int": 1}}}), "scalar"),
    "deep-nesting-10000": (deep_nesting(10_000), "depth"),
    "huge-array-length": (raw_metadata(b"\xa1\x67tensors\x9b" + b"\xff" * 8), "CBOR"),
    "huge-map-length": (
        raw_metadata(b"\xa1\x67tensors\xbb\x00\x00\x00\x00\xff\xff\xff\xff"),
        "CBOR",
    ),
    "huge-bytes-length": (raw_metadata(b"\x5b\x00\x00\x00\x10\x00\x00\x00\x00"), "CBOR"),
    "huge-text-length": (raw_metadata(b"\xa1\x7b\x7f\xff\xff\xff\xff\xff\xff\xff"), "CBOR"),
    "duplicated-dtype-field": (duplicated_dtype_field(), "CBOR"),
    # --- descriptors ---
    "descriptor-not-a-map": (build({"tensors": {"w": ["F32", [4], [0, 16]]}}, F32x4), "not a map"),
    "missing-dtype": (one({"shape": [4], "data_offsets": [0, 16]}), "'dtype'"),
    "missing-shape": (one({"dtype": "F32", "data_offsets": [0, 16]}), "'shape'"),
    "missing-data-offsets": (one({"dtype": "F32", "shape": [4]}), "'data_offsets'"),
    "dtype-lowercase-f32": (one(descriptor("f32", [4])), "unknown dtype"),
    "dtype-bool-unknown-store": (one(descriptor({"Bool": "U16"}, [4])), "unknown dtype"),
    "dtype-two-entry-map": (one(descriptor({"Bool": "U8", "F32": None}, [4])), "unknown dtype"),
    "dtype-qfloat-missing-mode": (
        one(descriptor({"QFloat": {"value": "Q8S", "store": "Native"}}, [4], (0, 4))),
        "mode",
    ),
    "dtype-qfloat-value-is-list": (
        one(descriptor({"QFloat": {**QFLOAT_OK, "value": ["Q8S"]}}, [4], (0, 4))),
        "value",
    ),
    "dtype-qfloat-scale-is-map": (
        one(descriptor({"QFloat": {**QFLOAT_OK, "tensor": {"F32": 1}}}, [4], (0, 4))),
        "scale",
    ),
    "shape-negative-dim": (one(descriptor("F32", [-4], (0, 16))), "shape"),
    "shape-float-dim": (one(descriptor("F32", [4.0], (0, 16))), "shape"),
    "shape-bool-dim": (one(descriptor("F32", [True], (0, 4))), "shape"),
    "shape-not-a-list": (one(descriptor("F32", 4, (0, 16))), "shape"),
    "shape-dim-over-u64": (one(descriptor("F32", [2**64, 1], (0, 16))), "shape"),
    "shape-product-overflows-64-bits": (
        one(descriptor("F32", [2**40, 2**40], (0, 16))),
        "overflows",
    ),
    "data-offsets-three-entries": (one(descriptor("F32", [4], (0, 16, 32))), "data_offsets"),
    "data-offsets-negative": (one(descriptor("F32", [4], (-16, 0))), "data_offsets"),
    "data-offsets-not-ints": (one(descriptor("F32", [4], ("0", "16"))), "data_offsets"),
    "data-offsets-end-before-start": (one(descriptor("F32", [4], (16, 0))), "before start"),
    "tensor-over-10GiB": (
        one(descriptor("U8", [MAX_TENSOR_SIZE + 1], (0, MAX_TENSOR_SIZE + 1))),
        "limit",
    ),
    "param-id-negative": (one(descriptor("F32", [4], param_id=-1)), "param_id"),
    "param-id-text": (one(descriptor("F32", [4], param_id="1")), "param_id"),
    "more-than-100000-tensors": (too_many_tensors, "exceed"),  # built only when run
    # --- data section ---
    "offsets-past-eof": (one(descriptor("F32", [256], (0, 1024)), F32x4), "truncated"),
    "data-truncated-by-one-byte": (one(descriptor("F32", [4], (0, 16)), F32x4[:-1]), "truncated"),
    "bytes-not-shape-times-itemsize": (one(descriptor("F32", [3], (0, 16))), "needs 12"),
    "bytes-for-zero-element-shape": (one(descriptor("F32", [4, 0], (0, 16))), "needs 0"),
    "scalar-shape-wrong-bytes": (one(descriptor("F64", [], (0, 16))), "needs 8"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_file_is_a_burnpack_error(tmp_path, case):
    """One defect per case: a one-line BurnpackError that names the file, never anything else."""
    raw, fragment = CASES[case]
    path = tmp_path / "bad.bpk"
    path.write_bytes(raw() if callable(raw) else raw)
    with pytest.raises(burnpack.BurnpackError) as info:
        burnpack.read(path)
    message = str(info.value)
    assert str(path) in message
    assert len(message.splitlines()) == 1
    assert fragment in message, message


def test_there_are_at_least_twenty_cases():
    assert len(CASES) >= 20


def test_file_over_100GiB_is_refused_before_reading(tmp_path):
    """MAX_FILE_SIZE is checked first (a sparse file, so nothing is allocated or read)."""
    path = tmp_path / "huge.bpk"
    path.write_bytes(build())
    os.truncate(path, 100 * 1024**3 + 1)
    with pytest.raises(burnpack.BurnpackError, match="limit") as info:
        burnpack.read(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    """A missing file is a BurnpackError caused by the FileNotFoundError."""
    path = tmp_path / "absent.bpk"
    with pytest.raises(burnpack.BurnpackError) as info:
        burnpack.read(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_directory_is_not_a_burnpack(tmp_path):
    (tmp_path / "d.bpk").mkdir()
    with pytest.raises(burnpack.BurnpackError, match="a folder, not a Burnpack file; give the path of "
                       "a .bpk file") as info:
        burnpack.read(tmp_path / "d.bpk")
    assert str(tmp_path / "d.bpk") in str(info.value)


def test_fifo_is_refused_without_blocking(tmp_path):
    """Opening a FIFO for reading would wait for a writer forever; it is refused at once."""
    os.mkfifo(tmp_path / "pipe.bpk")
    with pytest.raises(burnpack.BurnpackError, match="not a regular file"):
        burnpack.read(tmp_path / "pipe.bpk")


def test_path_with_nul_byte(tmp_path):
    with pytest.raises(burnpack.BurnpackError, match="cannot open"):
        burnpack.read(f"{tmp_path}/a\0b.bpk")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unreadable_file(tmp_path):
    path = tmp_path / "locked.bpk"
    path.write_bytes(build())
    path.chmod(0)
    try:
        with pytest.raises(burnpack.BurnpackError) as info:
            burnpack.read(path)
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert isinstance(info.value.__cause__, PermissionError)


def test_error_is_one_line_for_hostile_names(tmp_path):
    """A tensor name full of newlines still gives a one-line message (names are repr()'d)."""
    path = tmp_path / "bad.bpk"
    path.write_bytes(build({"tensors": {"two\nlines\r": descriptor("f32", [4])}}, F32x4))
    with pytest.raises(burnpack.BurnpackError) as info:
        burnpack.read(path)
    assert len(str(info.value).splitlines()) == 1
