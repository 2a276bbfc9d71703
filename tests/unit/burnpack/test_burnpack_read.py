"""Reading Burnpack files: the Burn-written fixture, every dtype, both layouts, zero-copy views."""

from __future__ import annotations

import gc
import mmap
import os
import textwrap

import numpy as np
import pytest
from support.bpk_builder import build, descriptor
from support.commands import python

from workerpool import burnpack
from workerpool.burnpack import dtypes

# Section 5 of docs/burnpack-format.md: name -> (shape, relative data_offsets, absolute start).
MNIST = {
    "conv1.conv.bias": ((64,), (2304, 2560), 3840),
    "conv1.conv.weight": ((64, 1, 3, 3), (0, 2304), 1536),
    "conv1.norm.beta": ((64,), (2816, 3072), 4352),
    "conv1.norm.gamma": ((64,), (2560, 2816), 4096),
    "conv1.norm.running_mean": ((64,), (3072, 3328), 4608),
    "conv1.norm.running_var": ((64,), (3328, 3584), 4864),
    "conv2.conv.bias": ((64,), (151040, 151296), 152576),
    "conv2.conv.weight": ((64, 64, 3, 3), (3584, 151040), 5120),
    "conv2.norm.beta": ((64,), (151552, 151808), 153088),
    "conv2.norm.gamma": ((64,), (151296, 151552), 152832),
    "conv2.norm.running_mean": ((64,), (151808, 152064), 153344),
    "conv2.norm.running_var": ((64,), (152064, 152320), 153600),
    "fc1.bias": ((128,), (971520, 972032), 973056),
    "fc1.weight": ((1600, 128), (152320, 971520), 153856),
    "fc2.bias": ((128,), (1037568, 1038080), 1039104),
    "fc2.weight": ((128, 128), (972032, 1037568), 973568),
    "fc3.bias": ((10,), (1043200, 1043240), 1044736),
    "fc3.weight": ((128, 10), (1038080, 1043200), 1039616),
}
# Burn's write order (module declaration order), which differs from the sorted name order.
MNIST_DISK_ORDER = [
    "conv1.conv.weight", "conv1.conv.bias", "conv1.norm.gamma", "conv1.norm.beta",
    "conv1.norm.running_mean", "conv1.norm.running_var",
    "conv2.conv.weight", "conv2.conv.bias", "conv2.norm.gamma", "conv2.norm.beta",
    "conv2.norm.running_mean", "conv2.norm.running_var",
    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
]  # fmt: skip


def buffer_owner(array: np.ndarray) -> object:
    """The object at the end of an array's ``base`` chain (through a memoryview to its exporter)."""
    obj: object = array
    while isinstance(obj, np.ndarray) and obj.base is not None:
        obj = obj.base
    return obj.obj if isinstance(obj, memoryview) else obj


# --- the Burn-written fixture -----------------------------------------------------------------


def test_fixture_header_and_metadata(burn_mnist_path):
    """The fixture decodes as section 5 says: v1, aligned, data at 1536, no metadata or scalars."""
    pack = burnpack.read(burn_mnist_path)
    assert pack.version == 1
    assert pack.layout == "aligned"
    assert pack.data_start == 1536
    assert dict(pack.metadata) == {}
    assert dict(pack.scalars) == {}
    assert pack.mapped is True
    assert pack.identity.size == 1_044_776
    assert pack.total_bytes == 260_810 * 4


def test_fixture_tensor_table(burn_mnist_path):
    """Names (sorted, as Burn returns them), shapes, dtypes and absolute offsets match the table."""
    pack = burnpack.read(burn_mnist_path)
    assert list(pack.infos) == sorted(MNIST) == list(pack.tensors)
    for name, (shape, (start, end), absolute) in MNIST.items():
        info = pack.infos[name]
        assert info.name == name
        assert info.dtype == dtypes.BY_NAME["F32"]
        assert info.shape == shape
        assert info.offset == absolute == pack.data_start + start
        assert info.nbytes == end - start
        assert info.aligned
        array = pack.tensors[name]
        assert array.shape == shape
        assert array.dtype == np.dtype("<f4")


def test_fixture_param_ids(burn_mnist_path):
    """Every descriptor carries a random u64 param_id; the first matches the worked example."""
    infos = burnpack.read(burn_mnist_path).infos
    ids = [info.param_id for info in infos.values()]
    assert all(isinstance(i, int) and 0 <= i < 2**64 for i in ids)
    assert len(set(ids)) == len(ids)
    assert infos["conv1.conv.bias"].param_id == 0x83EB859ADFFB2071


def test_fixture_disk_order(burn_mnist_path):
    """disk_order() recovers Burn's declaration order, not the sorted metadata order."""
    pack = burnpack.read(burn_mnist_path)
    assert [info.name for info in pack.disk_order()] == MNIST_DISK_ORDER


def test_fixture_values_are_the_file_bytes(burn_mnist_path, burn_mnist_bytes):
    """Each view shows exactly the little-endian bytes at its offset, and the weights are sane."""
    pack = burnpack.read(burn_mnist_path)
    for name, info in pack.infos.items():
        assert (
            pack.tensors[name].tobytes()
            == burn_mnist_bytes[info.offset : info.offset + info.nbytes]
        )
        assert np.isfinite(pack.tensors[name]).all()
    assert (pack.tensors["conv1.norm.running_var"] > 0).all()


def test_fixture_views_are_read_only_and_zero_copy(burn_mnist_path):
    """Every tensor views one read-only mapping of the file; none can be made writeable."""
    pack = burnpack.read(burn_mnist_path)
    owners = {id(buffer_owner(array)) for array in pack.tensors.values()}
    assert len(owners) == 1
    owner = buffer_owner(pack.tensors["fc1.weight"])
    assert isinstance(owner, mmap.mmap)
    assert len(owner) == pack.identity.size
    for array in pack.tensors.values():
        assert not array.flags.writeable
        assert not array.flags.owndata
        assert array.flags.c_contiguous and array.flags.aligned
        with pytest.raises(ValueError):
            array.flags.writeable = True
    with pytest.raises(ValueError):
        pack.tensors["fc3.bias"][0] = 1.0
    # The views are windows on the mapping: the fc1.weight view starts 153856 bytes into it.
    mapped = np.frombuffer(owner, dtype="u1")
    assert np.shares_memory(pack.tensors["fc1.weight"], mapped)
    assert not np.shares_memory(pack.tensors["fc1.weight"], pack.tensors["fc1.bias"])


def test_fixture_round_trip_is_byte_identical(burn_mnist_path, burn_mnist_bytes, tmp_path):
    """Writing the fixture's tensors back in disk order with their param_ids reproduces Burn's file."""
    pack = burnpack.read(burn_mnist_path)
    out = tmp_path / "copy.bpk"
    burnpack.write(
        out,
        [(info.name, pack.tensors[info.name]) for info in pack.disk_order()],
        param_ids={name: info.param_id for name, info in pack.infos.items()},
    )
    assert out.read_bytes() == burn_mnist_bytes


# --- identity, lifetime, copy mode -------------------------------------------------------------


def test_identity_matches_stat(tmp_path):
    """FileIdentity is (device, inode, size, mtime_ns) of the file that was read."""
    path = tmp_path / "m.bpk"
    burnpack.write(path, {"w": np.arange(3, dtype="f4")})
    identity = burnpack.read(path).identity
    st = os.stat(path)
    assert identity == burnpack.FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def test_identity_changes_when_replaced_by_rename(tmp_path):
    """An atomic rewrite gives a new inode, while views of the old file keep the old bytes."""
    path = tmp_path / "m.bpk"
    burnpack.write(path, {"w": np.full(4, 1.0, dtype="f4")})
    old = burnpack.read(path)
    burnpack.write(path, {"w": np.full(4, 2.0, dtype="f4")})
    new = burnpack.read(path)
    assert new.identity.inode != old.identity.inode
    assert new.identity == burnpack.FileIdentity.of(os.stat(path))
    assert old.tensors["w"].tolist() == [1.0] * 4
    assert new.tensors["w"].tolist() == [2.0] * 4


def test_views_outlive_the_pack(tmp_path):
    """A view keeps its mapping alive after the Burnpack object is gone."""
    path = tmp_path / "m.bpk"
    burnpack.write(path, {"w": np.arange(1000, dtype="f4")})
    view = burnpack.read(path).tensors["w"]
    gc.collect()
    assert isinstance(buffer_owner(view), mmap.mmap)
    assert view.sum() == sum(range(1000))


def test_copy_mode_gives_equal_private_arrays(burn_mnist_path):
    """mmap=False: same values, read-only, but backed by a private buffer instead of a mapping."""
    mapped = burnpack.read(burn_mnist_path)
    copied = burnpack.read(burn_mnist_path, mmap=False)
    assert copied.mapped is False
    assert list(copied.tensors) == list(mapped.tensors)
    owner = buffer_owner(copied.tensors["fc1.weight"])
    assert isinstance(owner, bytearray)
    for name, array in copied.tensors.items():
        assert not isinstance(buffer_owner(array), mmap.mmap)
        assert not array.flags.writeable
        assert not np.shares_memory(array, mapped.tensors[name])
        np.testing.assert_array_equal(array, mapped.tensors[name])


_MMAP_FAILS = textwrap.dedent(
    """
    import logging, resource, sys
    import numpy as np
    from workerpool import burnpack

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    path = sys.argv[1]
    want = {k: v.copy() for k, v in burnpack.read(path, mmap=False).tensors.items()}
    logging.getLogger("warm-up").warning("warm-up")

    def vm_size():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # No address space left for a new mapping; small copies still fit in the existing heap.
    limit = vm_size() if hard == resource.RLIM_INFINITY else min(vm_size(), hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        pack = burnpack.read(path)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    same = all(np.array_equal(pack.tensors[k], want[k]) for k in want)
    print(pack.mapped, same, list(pack.tensors) == list(want))
    """
)


@pytest.mark.process
def test_mmap_failure_falls_back_to_a_copy(tmp_path):
    """A real mmap failure (ENOMEM under RLIMIT_AS, in a subprocess) logs a warning and copies."""
    path = tmp_path / "m.bpk"
    burnpack.write(
        path, {"a": np.arange(6, dtype="f4").reshape(2, 3), "b": np.arange(3, dtype="i8")}
    )
    result = python("-c", _MMAP_FAILS, path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "True"]
    warnings = [line for line in result.stderr.splitlines() if "workerpool.burnpack" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING"), result.stderr
    assert "cannot memory-map" in warnings[0] and str(path) in warnings[0]


def test_extensionless_path_gets_bpk_appended(tmp_path):
    """Like Burn's reader, a missing extensionless path falls back to '<path>.bpk'."""
    burnpack.write(tmp_path / "model.bpk", {"w": np.ones(2, dtype="f4")})
    pack = burnpack.read(tmp_path / "model")
    assert pack.path == str(tmp_path / "model.bpk")
    assert pack.tensors["w"].tolist() == [1.0, 1.0]


# --- every dtype -------------------------------------------------------------------------------

NUMPY_DTYPES = [
    ("F64", "<f8"), ("F32", "<f4"), ("F16", "<f2"),
    ("I64", "<i8"), ("I32", "<i4"), ("I16", "<i2"), ("I8", "i1"),
    ("U64", "<u8"), ("U32", "<u4"), ("U16", "<u2"), ("U8", "u1"),
    ("Bool(Native)", "?"),
]  # fmt: skip


def extreme_values(dtype: np.dtype) -> np.ndarray:
    """A 2x3 array holding each type's corner cases (limits, NaN, infinities, signed zero)."""
    if dtype.kind == "b":
        values = [True, False, True, True, False, False]
    elif dtype.kind == "f":
        info = np.finfo(dtype)
        values = [info.max, info.min, np.nan, -np.inf, -0.0, info.smallest_subnormal]
    else:
        info = np.iinfo(dtype)
        values = [info.max, info.min, 0, 1, info.max - 1, info.min + 1]
    return np.array(values, dtype=dtype).reshape(2, 3)


@pytest.mark.parametrize(("name", "code"), NUMPY_DTYPES, ids=[n for n, _ in NUMPY_DTYPES])
def test_numpy_dtype_round_trips(tmp_path, name, code):
    """Each numpy-expressible Burn dtype reads back with its name, numpy dtype and exact bytes."""
    array = extreme_values(np.dtype(code))
    path = tmp_path / "t.bpk"
    burnpack.write(path, {"t": array})
    pack = burnpack.read(path)
    assert pack.infos["t"].dtype.name == name
    assert pack.infos["t"].dtype.to_cbor() == dtypes.BY_NAME[name].to_cbor()
    got = pack.tensors["t"]
    assert got.dtype == np.dtype(code)
    assert got.shape == (2, 3)
    assert got.tobytes() == array.tobytes()


def test_big_endian_arrays_are_stored_little_endian(tmp_path):
    """A big-endian or non-contiguous input is written as Burn's little-endian C-order bytes."""
    values = np.arange(12, dtype="<i4").reshape(3, 4)
    path = tmp_path / "t.bpk"
    burnpack.write(path, {"be": values.astype(">i4"), "t": values.T})
    pack = burnpack.read(path)
    assert pack.tensors["be"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(pack.tensors["be"], values)
    np.testing.assert_array_equal(pack.tensors["t"], values.T)


@pytest.mark.parametrize(
    ("name", "stored", "cbor"),
    [
        ("BF16", np.array([0x3F80, 0xC020, 0x7F80, 0x0000], dtype="<u2"), "BF16"),
        ("Flex32", np.array([1.5, -2.25, np.inf, 0.0], dtype="<f4"), "Flex32"),
        ("Bool(U8)", np.array([0, 1, 7, 255], dtype="u1"), {"Bool": "U8"}),
        ("Bool(U32)", np.array([0, 1, 2**31, 5], dtype="<u4"), {"Bool": "U32"}),
    ],
    ids=["BF16", "Flex32", "Bool(U8)", "Bool(U32)"],
)
def test_deferred_only_dtypes_round_trip(tmp_path, name, stored, cbor):
    """Dtypes without a numpy equivalent are written via Deferred and read back as their store."""
    path = tmp_path / "t.bpk"
    array = stored.reshape(2, 2)
    burnpack.write(path, {"t": burnpack.Deferred(dtypes.BY_NAME[name], (2, 2), lambda: array)})
    pack = burnpack.read(path)
    info = pack.infos["t"]
    assert info.dtype.name == name
    assert info.dtype.to_cbor() == cbor
    assert pack.tensors["t"].dtype == stored.dtype
    assert pack.tensors["t"].tobytes() == array.tobytes()


QUANT_SCHEMES = {
    "per-tensor-q8": {
        "value": "Q8S",
        "store": "Native",
        "mode": "Symmetric",
        "tensor": "F32",
        "block": None,
    },
    "block-q4-packed": {
        "value": "Q4S",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": None,
        "block": {"size": {"storage": [32, 0, 0, 0, 0], "len": 1}, "dtype": "F16"},
    },
}


@pytest.mark.parametrize("scheme_id", sorted(QUANT_SCHEMES))
def test_qfloat_round_trips_raw_bytes_and_scheme(tmp_path, scheme_id):
    """QFloat is opaque: the raw bytes (length not prod(shape)) come back with the decoded scheme."""
    scheme = QUANT_SCHEMES[scheme_id]
    payload = np.random.default_rng(0).integers(0, 256, size=37, dtype=np.uint8)
    path = tmp_path / "q.bpk"
    burnpack.write(
        path,
        {"q": burnpack.Deferred(burnpack.qfloat(scheme), (4, 8), lambda: payload, nbytes=37)},
    )
    pack = burnpack.read(path)
    info = pack.infos["q"]
    assert info.dtype.name == "QFloat"
    assert info.dtype.scheme == scheme
    assert info.dtype.itemsize is None
    assert info.shape == (4, 8)
    assert info.nbytes == 37
    assert pack.tensors["q"].dtype == np.dtype("u1")
    assert pack.tensors["q"].tobytes() == payload.tobytes()


def test_bf16_to_float32_widens_exactly():
    """BF16 is the top half of an f32: 1.0 is 0x3F80, and widening restores the f32 exactly."""
    assert burnpack.bf16_to_float32(np.array([0x3F80], dtype="<u2")).tolist() == [1.0]
    exact = np.array([[1.0, -2.5, 3.140625], [np.inf, -0.0, 2.0**-130]], dtype="<f4")
    bits = (exact.view("<u4") >> 16).astype("<u2")
    widened = burnpack.bf16_to_float32(bits)
    assert widened.dtype == np.dtype("<f4")
    assert widened.shape == (2, 3)
    assert widened.tobytes() == exact.tobytes()
    assert np.isnan(burnpack.bf16_to_float32(np.array([0x7FC0], dtype="<u2"))).all()
    assert not np.shares_memory(widened, bits)


def test_scalar_and_zero_element_tensors(tmp_path):
    """Shape () holds one element; shapes (3, 0) and (0,) hold none and keep their shape."""
    path = tmp_path / "t.bpk"
    burnpack.write(
        path,
        [
            ("empty2d", np.zeros((3, 0), dtype="f4")),
            ("scalar", np.array(2.5, dtype="f8")),
            ("empty", np.zeros((0,), dtype="i2")),
            ("after", np.arange(3, dtype="u1")),
        ],
    )
    pack = burnpack.read(path)
    assert pack.tensors["scalar"].shape == ()
    assert pack.tensors["scalar"][()] == 2.5
    assert pack.infos["scalar"].nbytes == 8
    assert pack.tensors["empty2d"].shape == (3, 0)
    assert pack.tensors["empty"].shape == (0,)
    assert pack.tensors["empty"].dtype == np.dtype("<i2")
    assert pack.infos["empty2d"].nbytes == pack.infos["empty"].nbytes == 0
    # Writer order: empty2d at 0, scalar at 0, empty at 256 (the aligned start), after at 256.
    rel = {name: info.offset - pack.data_start for name, info in pack.infos.items()}
    assert rel == {"empty2d": 0, "scalar": 0, "empty": 256, "after": 256}
    assert [i.name for i in pack.disk_order()] == ["empty2d", "scalar", "empty", "after"]
    assert pack.tensors["after"].tolist() == [0, 1, 2]


def test_zero_element_tensor_written_last_extends_file(tmp_path):
    """An empty last tensor sits at the next aligned offset, and the file ends exactly there."""
    path = tmp_path / "t.bpk"
    burnpack.write(path, [("a", np.arange(3, dtype="f4")), ("z", np.zeros((2, 0), dtype="f8"))])
    size = path.stat().st_size
    pack = burnpack.read(path)
    assert pack.infos["z"].offset == pack.data_start + 256 == size
    assert pack.tensors["z"].shape == (2, 0)
    assert pack.tensors["a"].tolist() == [0.0, 1.0, 2.0]


# --- hand-built files --------------------------------------------------------------------------


def test_legacy_unaligned_layout(tmp_path):
    """A Burn 0.19 file (data right after the metadata, tensors packed back to back) reads right."""
    a = np.array([1.5, -2.0, 3.25], dtype="<f4")
    b = np.array([-(2**40), 7], dtype="<i8")
    c = np.array([[1, 2, 3]], dtype="<u2")
    data = a.tobytes() + b.tobytes() + c.tobytes()
    meta = {
        "tensors": {
            "a": descriptor("F32", [3], (0, 12)),
            "b": descriptor("I64", [2], (12, 28)),
            "c": descriptor("U16", [1, 3], (28, 34)),
            "d": descriptor("F32", [0], (34, 34)),
        }
    }
    raw = build(meta, data, legacy=True)
    metadata_size = int.from_bytes(raw[6:10], "little")
    assert (10 + metadata_size) % 256 != 0
    path = tmp_path / "old.bpk"
    path.write_bytes(raw)
    pack = burnpack.read(path)
    assert pack.layout == "legacy"
    assert pack.data_start == 10 + metadata_size
    assert pack.infos["b"].offset == 10 + metadata_size + 12
    assert not pack.infos["b"].aligned
    assert pack.tensors["a"].tolist() == a.tolist()
    assert pack.tensors["b"].tolist() == b.tolist()
    assert pack.tensors["c"].tolist() == c.tolist()
    assert pack.tensors["d"].shape == (0,)
    assert not pack.tensors["b"].flags.writeable


def test_lenient_where_burn_is_lenient(tmp_path):
    """Burn ignores unknown keys, trailing CBOR bytes and trailing file bytes; version 0 is fine."""
    import cbor2

    meta = {
        "future": [1, 2],
        "tensors": {"w": {**descriptor("F32", [2], (0, 8)), "extra": "ignored"}},
        "metadata": {"k": "v"},
    }
    blob = cbor2.dumps(meta) + b"\xff trailing junk"
    path = tmp_path / "t.bpk"
    path.write_bytes(build(blob, np.array([1, 2], dtype="<f4").tobytes() + b"junk", version=0))
    pack = burnpack.read(path)
    assert pack.version == 0
    assert pack.layout == "aligned"
    assert dict(pack.metadata) == {"k": "v"}
    assert pack.tensors["w"].tolist() == [1.0, 2.0]


def test_unaligned_and_overlapping_ranges_are_accepted(tmp_path):
    """Alignment and overlap are not Burn's reader's business: offsets 4 and 0..8 both read."""
    data = np.array([10, 20, 30], dtype="<i4").tobytes()
    meta = {
        "tensors": {
            "all": descriptor("I32", [3], (0, 12)),
            "tail": descriptor("I32", [2], (4, 12)),
        }
    }
    path = tmp_path / "t.bpk"
    path.write_bytes(build(meta, data))
    pack = burnpack.read(path)
    assert pack.tensors["tail"].tolist() == [20, 30]
    assert not pack.infos["tail"].aligned
    assert np.shares_memory(pack.tensors["all"], pack.tensors["tail"])


def test_empty_pack(tmp_path):
    """An empty pack is 256 bytes: header, 'a1 67 tensors a0' and zero padding."""
    path = tmp_path / "e.bpk"
    burnpack.write(path, {})
    raw = path.read_bytes()
    assert raw == b"NRUB\x01\x00\x0a\x00\x00\x00" + b"\xa1\x67tensors\xa0" + bytes(236)
    pack = burnpack.read(path)
    assert dict(pack.tensors) == {} and pack.data_start == 256 and pack.layout == "aligned"
