"""``workerpool convert``: real safetensors, .npz and model folders in, Burnpack files out."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from support.commands import cli

from workerpool import burnpack
from workerpool.models.bert import CONFIG_KEY, TOKENIZER_KEY
from workerpool.models.texts import MAX_LENGTH_KEY
from workerpool.weights.convert import convert
from workerpool.weights.sources import ConvertError

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="needs the safetensors package")

ARRAYS = {
    "layer.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "layer.half": np.linspace(-1, 1, 6, dtype=np.float16).reshape(2, 3),
    "ids": np.array([[1, -2, 3]], dtype=np.int64),
    "bytes": np.arange(5, dtype=np.uint8),
    "flags": np.array([True, False, True]),
    "scalar": np.array(2.5, dtype=np.float64),
}


def raw_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file written by hand (8-byte header length, JSON header, data), for dtypes
    numpy cannot hold."""
    header, offset, data = {}, 0, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
        data += payload
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def test_safetensors_keep_names_dtypes_shapes_and_values(tmp_path):
    source = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(ARRAYS, str(source))
    done = convert(str(source), str(tmp_path / "out.bpk"), metadata={"origin": "test"})
    pack = burnpack.read(tmp_path / "out.bpk")
    assert done.tensors == len(ARRAYS) and set(pack.tensors) == set(ARRAYS)
    for name, array in ARRAYS.items():
        np.testing.assert_array_equal(pack.tensors[name], array)
        assert pack.tensors[name].dtype == array.dtype and pack.tensors[name].shape == array.shape
    assert pack.infos["flags"].dtype.name == "Bool(Native)" and pack.metadata == {"origin": "test"}
    assert all(info.aligned for info in pack.infos.values())


def test_bf16_keeps_its_bits(tmp_path):
    bits = np.array([0x3F80, 0x4000, 0xC040, 0x7F80], dtype="<u2")  # 1, 2, -3, inf
    raw_safetensors(tmp_path / "m.safetensors", {"w": ("BF16", [2, 2], bits.tobytes()),
                                                 "b": ("F32", [1], np.float32(7).tobytes())})
    convert(str(tmp_path / "m.safetensors"), str(tmp_path / "out.bpk"))
    pack = burnpack.read(tmp_path / "out.bpk")
    assert pack.infos["w"].dtype.name == "BF16"
    np.testing.assert_array_equal(pack.tensors["w"], bits.reshape(2, 2))
    np.testing.assert_array_equal(burnpack.bf16_to_float32(pack.tensors["w"]).ravel(), [1, 2, -3, np.inf])


def test_npz_is_read_without_pickle_and_globs_pick_tensors(tmp_path):
    np.savez(tmp_path / "w.npz", **ARRAYS)
    convert(str(tmp_path / "w.npz"), str(tmp_path / "out.bpk"), model="mlp",
            include=["layer.*", "ids"], exclude=["*.half"])
    pack = burnpack.read(tmp_path / "out.bpk")
    assert set(pack.tensors) == {"layer.weight", "ids"}
    assert pack.metadata == {"workerpool.model": "mlp"}
    np.testing.assert_array_equal(pack.tensors["ids"], ARRAYS["ids"])


def test_a_model_folder_carries_its_config_tokenizer_and_sequence_length(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    config = {"model_type": "bert", "hidden_size": 4, "max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    safetensors_numpy.save_file({"a": ARRAYS["layer.weight"]}, str(folder / "model-1.safetensors"))
    safetensors_numpy.save_file({"b": ARRAYS["bytes"]}, str(folder / "model-2.safetensors"))
    done = convert(str(folder), str(tmp_path / "out.bpk"))
    pack = burnpack.read(tmp_path / "out.bpk")
    assert set(pack.tensors) == {"a", "b"} and done.model == "bert"
    assert json.loads(pack.metadata[CONFIG_KEY]) == config
    assert pack.metadata[TOKENIZER_KEY] == '{"version": "1.0"}'
    assert pack.metadata[MAX_LENGTH_KEY] == "64"  # the positions the model has bound it


def broken(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A source that cannot be converted, and what the one-line error says."""
    if case == "missing":
        return tmp_path / "nope.safetensors", "no such file or folder"
    if case == "unsupported dtype":
        raw_safetensors(tmp_path / "f8.safetensors", {"w": ("F8_E4M3", [2], b"\0\0")})
        return tmp_path / "f8.safetensors", "dtype F8_E4M3, which Burnpack cannot store"
    if case == "not safetensors":
        (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
        return tmp_path / "junk.safetensors", "cannot read as safetensors"
    if case == "pickled npz":
        np.savez(tmp_path / "obj.npz", o=np.array([{"a": 1}], dtype=object))
        return tmp_path / "obj.npz", "dtype object, which Burnpack cannot store"
    if case == "npz header lies":
        member = io.BytesIO()  # a .npy header claiming 4 TB, then 16 bytes
        np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (10**12,)})
        with zipfile.ZipFile(tmp_path / "big.npz", "w") as archive:
            archive.writestr("a.npy", member.getvalue() + bytes(16))
        return tmp_path / "big.npz", "the archive holds"
    if case == "unknown format":
        (tmp_path / "w.pt").write_bytes(b"x")
        return tmp_path / "w.pt", "not a .safetensors file, an .npz archive or a model folder"
    folder = tmp_path / "hf"
    folder.mkdir()
    if case == "duplicate name":
        (folder / "config.json").write_text("{}")
        for part in ("1", "2"):
            safetensors_numpy.save_file({"w": ARRAYS["bytes"]}, str(folder / f"m-{part}.safetensors"))
        return folder, "tensor w appears in more than one file"
    assert case == "folder without config"
    safetensors_numpy.save_file({"w": ARRAYS["bytes"]}, str(folder / "m.safetensors"))
    return folder, "a model folder needs its config.json"


@pytest.mark.process
@pytest.mark.parametrize("case", ["missing", "unsupported dtype", "not safetensors", "pickled npz", "npz header lies",
                                  "unknown format", "duplicate name", "folder without config"])
def test_what_cannot_be_converted_is_one_line_and_writes_nothing(tmp_path, case):
    source, message = broken(tmp_path, case)
    with pytest.raises(ConvertError, match=message):
        convert(str(source), str(tmp_path / "out.bpk"))
    done = cli("convert", source, tmp_path / "out.bpk")
    assert done.returncode == 1 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out.bpk").exists()


@pytest.mark.process
def test_the_command_line_reports_what_it_wrote(tmp_path):
    safetensors_numpy.save_file(ARRAYS, str(tmp_path / "m.safetensors"))
    done = cli("convert", tmp_path / "m.safetensors", tmp_path / "out.bpk", "--metadata", "k=v=w",
               "--exclude", "flags", "--model", "mlp")
    assert done.returncode == 0, done.stderr
    assert f"wrote {tmp_path / 'out.bpk'}: 5 tensors" in done.stdout and "model mlp" in done.stdout
    assert burnpack.read(tmp_path / "out.bpk").metadata == {"k": "v=w", "workerpool.model": "mlp"}
    refused = cli("convert", tmp_path / "m.safetensors", tmp_path / "x.bpk", "--metadata", "novalue")
    assert refused.returncode == 2 and "expected KEY=VALUE" in refused.stderr
