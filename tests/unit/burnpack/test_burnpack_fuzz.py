"""Seeded fuzzing of the reader: only BurnpackError may ever escape.

Three corpora: the Burn-written fixture and a small generated file with metadata, scalars and
varied dtypes get random truncations, byte flips and shifts (biased to the header and CBOR,
where the parsing happens); the small file's decoded CBOR also gets structural mutations
(values swapped for other types) so that the semantic checks, not just the CBOR decoder, are
exercised. Every case derives its own ``random.Random`` from SEED and its index, so a failure
message names everything needed to replay it.
"""

from __future__ import annotations

import math
import random
import time

import cbor2
import numpy as np
import pytest
from support.bpk_builder import build

from workerpool import burnpack
from workerpool.burnpack import dtypes

SEED = 0xB9C0DE
BYTE_CASES = 1500  # per byte-level corpus
STRUCT_CASES = 1000

INTERESTING_BYTES = [0x00, 0x01, 0x17, 0x18, 0x1B, 0x20, 0x3B, 0x40, 0x5B, 0x60, 0x7B, 0x7F,
                     0x80, 0x9B, 0x9F, 0xA0, 0xBB, 0xBF, 0xC2, 0xD8, 0xF5, 0xF9, 0xFB, 0xFF]  # fmt: skip


def small_pack(path) -> None:
    """A file touching every descriptor feature: metadata, scalars, param_ids, many dtypes."""
    scheme = {"value": "Q4S", "store": {"PackedU32": 0}, "mode": "Symmetric", "tensor": "F16",
              "block": {"size": {"storage": [32, 0, 0, 0, 0], "len": 1}, "dtype": "F16"}}  # fmt: skip
    burnpack.write(
        path,
        [
            ("layer.0.weight", np.linspace(-1, 1, 12, dtype="f4").reshape(3, 4)),
            ("layer.0.bias", np.arange(3, dtype="f2")),
            ("step", np.array(7, dtype="i8")),
            ("empty", np.zeros((2, 0), dtype="u2")),
            ("mask", np.array([True, False, True])),
            (
                "bf",
                burnpack.Deferred(
                    dtypes.BY_NAME["BF16"], (2,), lambda: np.array([0x3F80, 0xC000], "u2")
                ),
            ),
            (
                "q",
                burnpack.Deferred(
                    burnpack.qfloat(scheme), (2, 8), lambda: np.arange(6, dtype="u1"), nbytes=6
                ),
            ),
        ],
        metadata={"format": "burnpack", "producer": "burn", "version": "0.22.0-pre.2"},
        scalars={"lr": 0.001, "epoch": 3, "big": 2**63 + 5, "warm": True, "loss": float("nan")},
        param_ids={"layer.0.weight": 2**64 - 1, "step": 12},
    )


def check(path, label: str) -> bool:
    """Read ``path``; True if accepted, False if refused; any other exception fails the test."""
    try:
        pack = burnpack.read(path)
    except burnpack.BurnpackError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message, f"{label}: bad message {message!r}"
        return False
    except Exception as exc:  # noqa: BLE001 - the whole point is that nothing else escapes
        pytest.fail(f"{label}: {type(exc).__name__} escaped: {exc}")
    for name, array in pack.tensors.items():  # every accepted view must be readable in bounds
        info = pack.infos[name]
        assert array.nbytes == info.nbytes, label
        array.tobytes()
    return True


def mutate_bytes(rng: random.Random, data: bytes, hot: int) -> tuple[bytes, str]:
    """Truncate, flip bytes, or shift the header/metadata region; mostly within ``hot``."""
    out = bytearray(data)
    kind = rng.random()

    def where() -> int:
        return rng.randrange(hot if rng.random() < 0.85 else len(out))

    if kind < 0.2:
        cut = where() if rng.random() < 0.5 else rng.randrange(len(out) + 1)
        return bytes(out[:cut]), f"truncate at {cut}"
    if kind < 0.85:
        edits = []
        for _ in range(rng.randint(1, 6)):
            pos = where()
            if rng.random() < 0.5:
                out[pos] ^= 1 << rng.randrange(8)
            else:
                out[pos] = (
                    rng.choice(INTERESTING_BYTES) if rng.random() < 0.6 else rng.randrange(256)
                )
            edits.append(pos)
        return bytes(out), f"flip at {edits}"
    pos, count = where(), rng.randint(1, 16)
    if rng.random() < 0.5:
        del out[pos : pos + count]
        return bytes(out), f"delete {count} at {pos}"
    out[pos:pos] = bytes(rng.randrange(256) for _ in range(count))
    return bytes(out), f"insert {count} at {pos}"


def random_value(rng: random.Random, depth: int = 0):
    choices = [
        None, True, False, 0, 1, -1, 255, 2**32, 2**63, 2**64 - 1, 2**64, -(2**63) - 1,
        1.5, -0.0, math.inf, math.nan, "", "F32", "f32", "Bool", "Native", "U32", "QFloat",
        "Symmetric", "Q8S", "tensors", b"", b"\x00\x01", [], {}, [2**40, 2**40], [0, 2**64 - 1],
        {"Bool": "U8"}, {"QFloat": {"value": "Q8S", "store": "Native", "mode": "Symmetric"}},
        {"Int": 1}, {"Float": "x"}, {"PackedU32": -1},
    ]  # fmt: skip
    if depth < 2 and rng.random() < 0.2:
        if rng.random() < 0.5:
            return [random_value(rng, depth + 1) for _ in range(rng.randint(1, 3))]
        return {rng.choice(["dtype", "shape", "value", "k", 7]): random_value(rng, depth + 1)}
    return rng.choice(choices)


def mutate_document(rng: random.Random, document):
    """Replace, delete or add one entry somewhere in a decoded metadata document."""
    slots = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                slots.append((node, key))
                walk(value)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                slots.append((node, index))
                walk(value)

    walk(document)
    container, key = rng.choice(slots)
    action = rng.random()
    if action < 0.7:
        container[key] = random_value(rng)
        return f"set {key!r} to {container[key]!r}"
    if action < 0.85 and isinstance(container, dict):
        del container[key]
        return f"delete {key!r}"
    if isinstance(container, dict):
        new_key = rng.choice(["param_id", "metadata", "scalars", "dtype", "extra", 3, b"k"])
        container[new_key] = random_value(rng)
        return f"add {new_key!r}"
    container.append(random_value(rng))
    return "append"


def split(raw: bytes) -> tuple[bytes, bytes]:
    size = int.from_bytes(raw[6:10], "little")
    start = -(-(10 + size) // 256) * 256
    return raw[10 : 10 + size], raw[start:]


@pytest.mark.parametrize("corpus", ["burn-mnist", "small"])
def test_fuzz_bytes(tmp_path, request, corpus):
    """1500 truncations / flips / shifts per corpus: each is accepted or refused with BurnpackError."""
    if corpus == "burn-mnist":
        data = request.getfixturevalue("burn_mnist_bytes")
    else:
        small_pack(tmp_path / "small.bpk")
        data = (tmp_path / "small.bpk").read_bytes()
    hot = 10 + int.from_bytes(data[6:10], "little") + 16  # header, CBOR, a little padding
    target = tmp_path / "fuzz.bpk"
    started = time.perf_counter()
    accepted = 0
    for case in range(BYTE_CASES):
        rng = random.Random(f"{SEED}-{corpus}-{case}")
        mutated, what = mutate_bytes(rng, data, hot)
        target.write_bytes(mutated)
        accepted += check(target, f"seed {SEED:#x} corpus {corpus} case {case} ({what})")
    elapsed = time.perf_counter() - started
    # Both outcomes must occur, or the mutations are not reaching the parser.
    assert 0 < accepted < BYTE_CASES, accepted
    assert elapsed < 20, f"fuzzing took {elapsed:.1f}s"


def test_fuzz_metadata_structure(tmp_path):
    """1000 type-confused metadata documents (re-encoded, header fixed up): only BurnpackError."""
    small = tmp_path / "small.bpk"
    small_pack(small)
    blob, data = split(small.read_bytes())
    target = tmp_path / "fuzz.bpk"
    refused = 0
    for case in range(STRUCT_CASES):
        rng = random.Random(f"{SEED}-struct-{case}")
        document = cbor2.loads(blob)
        what = mutate_document(rng, document)
        target.write_bytes(build(cbor2.dumps(document), data))
        refused += not check(target, f"seed {SEED:#x} structural case {case} ({what})")
    assert 0 < refused < STRUCT_CASES
