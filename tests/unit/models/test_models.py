"""Built-in models, model choice and the mlp generator, on real Burnpack files."""

from __future__ import annotations

import itertools
import math
import sys
import tracemalloc
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.models import batch_outcomes
from support.paths import BURN_MNIST

from workerpool import burnpack
from workerpool.models import (
    BUILTIN_MODELS,
    BurnMnist,
    Contract,
    Mlp,
    ModelError,
    ModelInputError,
    build_model,
    choose_model,
    generate_mlp,
    ops,
    recognise,
    resolve,
)
from workerpool.models.loaded import LoadedModel

FIXTURE = BURN_MNIST
MiB = 1024 * 1024
_erf = np.vectorize(math.erf, otypes=[np.float64])


@pytest.fixture(scope="module")
def mnist_pack() -> burnpack.Burnpack:
    if not FIXTURE.exists():
        pytest.skip(
            f"Burn-written fixture {FIXTURE} is absent (it lives in ../shared, outside the repo)"
        )
    return burnpack.read(FIXTURE)


def write_mlp(path: Path, dims: list[int], seed: int = 0, **metadata: str) -> burnpack.Burnpack:
    rng = np.random.default_rng(seed)
    tensors = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        tensors.append((f"layers.{i}.weight", rng.standard_normal((d_in, d_out), dtype=np.float32)))
        tensors.append((f"layers.{i}.bias", rng.standard_normal(d_out, dtype=np.float32)))
    burnpack.write(path, tensors, metadata=metadata)
    return burnpack.read(path)


def held_arrays(obj: object, seen: set[int] | None = None) -> list[np.ndarray]:
    """Every ndarray reachable from ``obj`` through attributes and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    elif isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        return []
    else:
        children = list(getattr(obj, "__dict__", {}).values())
    return [array for child in children for array in held_arrays(child, seen)]


def served(model: Any) -> Callable[[Any], Any]:
    """``model`` called as a worker calls it: each input checked and admitted by its contract
    (a bare row gets its batch axis), which built-in models leave to it."""
    contract = Contract.of(model, model.name)
    return lambda inputs: model(contract.admit(inputs)[1])


def assert_zero_copy(model: object, pack: burnpack.Burnpack, expected_count: int) -> None:
    arrays = held_arrays(model)
    assert len(arrays) == expected_count
    for array in arrays:
        assert any(np.shares_memory(array, t) for t in pack.tensors.values())


# -- burn-mnist ------------------------------------------------------------------------------


def draw_one() -> np.ndarray:
    image = np.zeros((28, 28), np.float32)
    image[4:24, 13:15] = 255
    return image


def draw_zero() -> np.ndarray:
    yy, xx = np.mgrid[:28, :28]
    radius = np.hypot((yy - 14) / 1.3, xx - 14)
    return np.where((radius > 5) & (radius < 8), 255, 0).astype(np.float32)


def draw_seven() -> np.ndarray:
    image = np.zeros((28, 28), np.float32)
    image[6:8, 7:21] = 255
    for k in range(16):
        image[8 + k, 19 - k // 2 : 21 - k // 2] = 255
    return image


def reference_mnist(t: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """Section 5 of the format notes, written independently: NCHW, float64, direct convolution."""
    t = {name: value.astype(np.float64) for name, value in t.items()}
    x = ((images.astype(np.float64) / 255) - 0.1307) / 0.3081
    x = x[:, np.newaxis]
    for block in ("conv1", "conv2"):
        weight = t[f"{block}.conv.weight"]
        height, width = x.shape[2] - 2, x.shape[3] - 2
        y = (
            np.zeros((len(x), weight.shape[0], height, width))
            + t[f"{block}.conv.bias"][:, None, None]
        )
        for i in range(3):
            for j in range(3):
                y += np.einsum(
                    "bchw,oc->bohw", x[:, :, i : i + height, j : j + width], weight[:, :, i, j]
                )
        mean, var, gamma, beta = (
            t[f"{block}.norm.{name}"][:, None, None]
            for name in ("running_mean", "running_var", "gamma", "beta")
        )
        y = (y - mean) / np.sqrt(var + 1e-5) * gamma + beta
        y = np.maximum(y, 0)
        h, w = height // 2, width // 2
        x = np.max([y[:, :, a : 2 * h : 2, b : 2 * w : 2] for a in (0, 1) for b in (0, 1)], axis=0)
    x = x.reshape(len(x), -1)
    for fc in ("fc1", "fc2"):
        x = x @ t[f"{fc}.weight"] + t[f"{fc}.bias"]
        x = x * 0.5 * (1 + _erf(x / math.sqrt(2)))
    return x @ t["fc3.weight"] + t["fc3.bias"]


def test_fixture_is_recognised_as_burn_mnist(mnist_pack):
    assert recognise(mnist_pack.tensors) == "burn-mnist"
    assert choose_model(None, mnist_pack.tensors, mnist_pack.metadata) == ("burn-mnist", BurnMnist)


@pytest.mark.parametrize("shape", [(1, 28, 28), (4, 28, 28), (28, 28)])
def test_mnist_gives_finite_logits(mnist_pack, shape):
    model = served(build_model(mnist_pack.tensors, mnist_pack.metadata))
    images = np.random.default_rng(1).uniform(0, 255, shape).astype(np.float32)
    logits = model(images)
    batch = shape[0] if len(shape) == 3 else 1
    assert logits.shape == (batch, 10)
    assert logits.dtype == np.float32
    assert np.isfinite(logits).all()


def test_mnist_matches_direct_convolution_reference(mnist_pack):
    model = build_model(mnist_pack.tensors, mnist_pack.metadata)
    noise = np.random.default_rng(2).uniform(0, 255, (28, 28)).astype(np.float32)
    images = np.stack([draw_one(), noise])
    expected = reference_mnist(dict(mnist_pack.tensors), images)
    got = model(images)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_mnist_reads_drawn_digits(mnist_pack):
    model = served(build_model(mnist_pack.tensors, mnist_pack.metadata))
    images = np.stack([draw_zero(), draw_one(), draw_seven()])
    assert model(images).argmax(axis=1).tolist() == [0, 1, 7]
    assert model(draw_one().astype(np.uint8)).argmax() == 1


def test_mnist_holds_only_the_files_arrays(mnist_pack):
    model = build_model(mnist_pack.tensors, mnist_pack.metadata)
    served(model)(draw_one())
    assert_zero_copy(model, mnist_pack, expected_count=18)


def test_mnist_declares_its_signature(mnist_pack):
    model = build_model(mnist_pack.tensors, mnist_pack.metadata)
    assert model.name == "burn-mnist"
    assert model.input_shape == (None, 28, 28)
    assert model.output_shape == (None, 10)
    assert model.input_dtype == np.float32
    assert model(np.zeros((0, 28, 28), np.float32)).shape == (0, 10)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((3, 28, 27), np.float32),
        np.zeros((784,), np.float32),
        np.zeros((2, 1, 28, 28), np.float32),
        np.zeros((28, 28), np.float64),
        [[0.0] * 28] * 28,
    ],
    ids=["width", "flat", "rank4", "float64", "list"],
)
def test_mnist_rejects_bad_input(mnist_pack, bad):
    model = served(build_model(mnist_pack.tensors, mnist_pack.metadata))
    with pytest.raises(
        ModelInputError, match=r"burn-mnist.* float32 or uint8 \[B, 28, 28\] or \[28, 28\]"
    ):
        model(bad)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("conv2.norm.running_var"), "conv2.norm.running_var is missing"),
        (
            lambda t: t.update({"fc3.weight": np.zeros((128, 9), np.float32)}),
            r"fc3.weight has shape \[128, 9\], expected \[128, 10\]",
        ),
        (
            lambda t: t.update({"fc1.bias": np.zeros(128, np.float64)}),
            "fc1.bias has dtype float64, expected float32",
        ),
    ],
    ids=["missing", "shape", "dtype"],
)
def test_mnist_refuses_misfit_weights(mnist_pack, change, message):
    weights = dict(mnist_pack.tensors)
    change(weights)
    with pytest.raises(ModelError, match=f"^burn-mnist: tensor {message}"):
        build_model(weights, {}, "burn-mnist")
    assert recognise(weights) is None


# -- mlp ------------------------------------------------------------------------------------


def reference_mlp(pack: burnpack.Burnpack, x: np.ndarray, activation: str) -> np.ndarray:
    count = len(pack.tensors) // 2
    x = x.astype(np.float64)
    for i in range(count):
        x = (
            x @ pack.tensors[f"layers.{i}.weight"].astype(np.float64)
            + pack.tensors[f"layers.{i}.bias"]
        )
        if i < count - 1:
            x = np.maximum(x, 0) if activation == "relu" else x * 0.5 * (1 + _erf(x / math.sqrt(2)))
    return x


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_mlp_matches_reference(tmp_path, activation):
    pack = write_mlp(tmp_path / "m.bpk", [12, 32, 16, 5], **{"workerpool.activation": activation})
    model = build_model(pack.tensors, pack.metadata, "mlp")
    x = np.random.default_rng(3).standard_normal((6, 12), dtype=np.float32)
    got = model(x)
    assert got.dtype == np.float32 and got.shape == (6, 5)
    np.testing.assert_allclose(got, reference_mlp(pack, x, activation), rtol=1e-5, atol=1e-5)
    single = served(model)(x[0])
    assert single.shape == (1, 5)
    np.testing.assert_array_equal(single, model(x[:1]))
    np.testing.assert_array_equal(model({"input": x}), got)


def test_mlp_declares_signature_and_lets_nan_through(tmp_path):
    pack = write_mlp(tmp_path / "m.bpk", [8, 4, 3])
    model = build_model(pack.tensors, pack.metadata, "mlp")
    assert (model.name, model.input_shape, model.output_shape) == ("mlp", (None, 8), (None, 3))
    assert model.input_dtype == np.float32 and model.activation == "relu"
    x = np.ones((2, 8), np.float32)
    x[0, 0] = np.nan
    y = model(x)
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()


def test_mlp_holds_only_the_files_arrays(tmp_path):
    pack = write_mlp(tmp_path / "m.bpk", [8, 16, 16, 3], **{"workerpool.activation": "gelu"})
    model = build_model(pack.tensors, pack.metadata, "mlp")
    model(np.ones((2, 8), np.float32))
    assert_zero_copy(model, pack, expected_count=6)


@pytest.mark.parametrize(
    "bad, got",
    [
        (np.zeros((3, 5), np.int64), r"int64 \[3, 5\]"),
        (np.zeros((3, 7), np.float32), r"float32 \[3, 7\]"),
        (np.zeros((2, 3, 8), np.float32), r"float32 \[2, 3, 8\]"),
        (np.zeros((3, 8), np.float64), r"float64 \[3, 8\]"),
        (np.array(1.0, np.float32), r"float32 \[\]"),
        (np.float32(1.0), "a float32$"),
        ({"x": np.zeros(8, np.float32)}, r"arrays named \['x'\] \(only 'input' is known\)"),
    ],
    ids=["int64", "width", "rank", "float64", "0-d", "scalar", "mapping"],
)
def test_mlp_rejects_bad_input(tmp_path, bad, got):
    pack = write_mlp(tmp_path / "m.bpk", [8, 4, 3])
    model = served(build_model(pack.tensors, pack.metadata, "mlp"))
    with pytest.raises(
        ModelInputError,
        match=rf"^mlp: expected float32 \[B, 8\] or \[8\], got {got}",
    ):
        model(bad)
    assert issubclass(ModelInputError, ValueError)


def test_a_rows_axis_of_any_size_is_written_any_not_as_a_batch_axis():
    declared = type("Declared", (), {"input_shape": (None, None, 3), "input_dtype": np.float32})()
    with pytest.raises(ModelInputError, match=r"^m: expected float32 \[B, any, 3\] or \[any, 3\], "
                                              r"got int8 \[3\]$"):
        Contract.of(declared, "m").check_input(np.zeros(3, np.int8))


def test_a_list_for_an_array_model_is_refused_as_texts(tmp_path):
    """A list reaches a worker only as texts: the wire carries no list of numbers."""
    pack = write_mlp(tmp_path / "m.bpk", [8, 4, 3])
    model = served(build_model(pack.tensors, pack.metadata, "mlp"))
    with pytest.raises(ModelInputError, match=r"^the model mlp takes arrays, not texts: send float32 "
                                              r"\[B, 8\] or \[8\]"):
        model([1.0] * 8)


def mlp_weights(dims: list[int], dtype=np.float32) -> dict[str, np.ndarray]:
    weights = {}
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        weights[f"layers.{i}.weight"] = np.zeros((d_in, d_out), dtype)
        weights[f"layers.{i}.bias"] = np.zeros(d_out, dtype)
    return weights


def test_weights_stored_as_pytorch_keeps_them_are_named_transposed():
    """nn.Linear's [out, in] matrices, converted as they are: not 'none recognised' alone."""
    weights = {name: tensor.T.copy() for name, tensor in mlp_weights([8, 32, 10]).items()}
    with pytest.raises(ModelError, match=r"none recognised from the 4 tensors \(they fit 'mlp' with every "
                       r"2-D weight transposed: layers.0.weight is \[32, 8\], stored \[out, in\] as "
                       r"PyTorch's nn.Linear keeps it, where 'mlp' takes \[in, out\]; save each one "
                       r"transposed, w.T.copy\(\), before converting\): name "):
        choose_model(None, weights, {})
    weights["extra"] = np.zeros(3, np.float32)  # fits nothing either way: no such guess
    with pytest.raises(ModelError, match=r"none recognised from the 5 tensors: name "):
        choose_model(None, weights, {})


def test_mlp_refuses_misfit_weights():
    weights = mlp_weights([8, 32, 10])
    weights["layers.1.weight"] = np.zeros((64, 10), np.float32)
    with pytest.raises(
        ModelError,
        match=r"^mlp: tensor layers.1.weight has shape \[64, 10\], expected \[32, d_out\]$",
    ):
        Mlp(weights, {})

    weights = mlp_weights([8, 32, 10])
    weights["layers.0.bias"] = np.zeros(31, np.float32)
    with pytest.raises(ModelError, match=r"layers.0.bias has shape \[31\], expected \[32\]"):
        Mlp(weights, {})

    weights = mlp_weights([8, 32, 10, 4])
    del weights["layers.1.weight"], weights["layers.1.bias"]
    with pytest.raises(ModelError, match="layers.1.weight is missing"):
        Mlp(weights, {})

    with pytest.raises(ModelError, match="layers.0.weight has dtype float64, expected float32"):
        Mlp(mlp_weights([8, 4], np.float64), {})
    with pytest.raises(ModelError, match="no layers.0.weight"):
        Mlp({"fc.weight": np.zeros((2, 2), np.float32)}, {})
    with pytest.raises(
        ModelError, match="workerpool.activation is 'tanh', expected one of relu, gelu"
    ):
        Mlp(mlp_weights([8, 4]), {"workerpool.activation": "tanh"})


def test_gelu_uses_exact_erf():
    x = np.concatenate([np.linspace(-40, 40, 400_001), [0.0, 0.46875, -4.0, 27.5, np.inf, -np.inf]])
    assert np.abs(ops.erf(x) - _erf(x)).max() < 1e-14
    assert np.isnan(ops.erf(np.array([np.nan]))).all()
    x32 = x.astype(np.float32)
    wide = x32.astype(np.float64)
    finite = np.isfinite(wide)
    expected = wide[finite] * 0.5 * (1 + _erf(wide[finite] / math.sqrt(2)))
    got = ops.gelu(x32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got[finite], expected, rtol=1e-7, atol=1e-37)
    assert got[-2] == np.inf and np.isnan(got[-1])  # -inf * 0, as in Burn


# -- choosing a model -----------------------------------------------------------------------

USER_MODULE = """
import numpy as np

class Scaled:
    def __init__(self, weights, metadata):
        self.w = weights["w"]
        self.k = np.float32(metadata.get("k", "1"))

    def __call__(self, x):
        return x * self.w * self.k

def make(weights, metadata):
    return Scaled(weights, metadata)

def broken(weights, metadata):
    raise RuntimeError("no good\\nat all")

def returns_none(weights, metadata):
    return None

not_callable = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    name = "wp_test_user_model"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_user_factory_from_module_spec(user_module):
    weights = {"w": np.arange(3, dtype=np.float32)}
    model = build_model(weights, {"k": "2"}, f"{user_module}:make")
    np.testing.assert_array_equal(model(np.ones(3, np.float32)), [0, 2, 4])
    assert resolve(f"{user_module}:Scaled").__name__ == "Scaled"


def test_choose_model_precedence(tmp_path, user_module):
    pack = write_mlp(tmp_path / "m.bpk", [4, 3])
    spec = f"{user_module}:make"
    with_key = {"workerpool.model": spec}
    assert choose_model("burn-mnist", pack.tensors, with_key) == ("burn-mnist", BurnMnist)
    name, factory = choose_model(None, pack.tensors, with_key)
    assert name == spec and factory.__name__ == "make"
    assert choose_model(None, pack.tensors, {}) == ("mlp", Mlp)
    assert choose_model("", pack.tensors, {}) == ("mlp", Mlp)
    with pytest.raises(ModelError) as caught:
        choose_model(None, {"w": np.zeros(3, np.float32)}, {})
    message = str(caught.value)
    assert all(
        word in message for word in [*BUILTIN_MODELS, "package.module:factory", "workerpool.model"]
    )
    assert "\n" not in message


def test_recognition_needs_exactly_the_models_tensors():
    weights = mlp_weights([8, 4, 2])
    assert recognise(weights) == "mlp"
    assert recognise({**weights, "extra": np.zeros(1, np.float32)}) is None
    assert recognise(mlp_weights([8, 4], np.float16)) is None
    assert recognise({}) is None


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "nope",
            "unknown model 'nope': expected a built-in model \\(mlp, burn-mnist, bert, onnx\\) or package.module:factory",
        ),
        ("{module}:missing", "has no attribute missing"),
        ("{module}:not_callable", "not_callable is not callable"),
        ("{module}:broken", "failed to build: RuntimeError: no good at all$"),
        ("{module}:returns_none", "factory returned a NoneType, not a callable"),
        ("wp_no_such_module:make", "cannot import wp_no_such_module: ModuleNotFoundError"),
        ("{module}:", "is not of the form package.module:factory"),
    ],
)
def test_model_errors_name_the_problem(user_module, spec, message):
    with pytest.raises(ModelError, match=message):
        build_model({"w": np.zeros(3, np.float32)}, {}, spec.format(module=user_module))


def test_unknown_model_in_metadata_names_the_key():
    with pytest.raises(ModelError, match="^metadata workerpool.model='resnet': unknown model"):
        build_model(mlp_weights([4, 2]), {"workerpool.model": "resnet"})


# -- generate_mlp ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1 * MiB, 16 * MiB])
def test_generate_mlp_size_and_contents(tmp_path, size):
    path = tmp_path / "gen.bpk"
    summary = generate_mlp(path, size)
    assert abs(path.stat().st_size - size) / size < 0.02
    assert summary.size_bytes == path.stat().st_size and summary.layers >= 2
    pack = burnpack.read(path)
    assert dict(pack.metadata) == {"workerpool.model": "mlp", "workerpool.activation": "relu"}
    assert recognise(pack.tensors) == "mlp"
    model = build_model(pack.tensors, pack.metadata)
    assert model.input_shape == (None, summary.dims[0]) and model.output_shape == (None, 10)
    x = np.random.default_rng(4).standard_normal((3, summary.dims[0]), dtype=np.float32)
    y = model(x)
    assert np.isfinite(y).all() and 0.01 < np.abs(y).mean() < 100


def test_generate_mlp_is_deterministic(tmp_path):
    first, again, other = tmp_path / "a.bpk", tmp_path / "b.bpk", tmp_path / "c.bpk"
    generate_mlp(first, MiB, seed=7, activation="gelu")
    generate_mlp(again, MiB, seed=7, activation="gelu")
    generate_mlp(other, MiB, seed=8, activation="gelu")
    assert first.read_bytes() == again.read_bytes()
    assert first.stat().st_size == other.stat().st_size
    assert first.read_bytes() != other.read_bytes()
    assert burnpack.read(first).metadata["workerpool.activation"] == "gelu"


def test_generate_mlp_streams_one_layer_at_a_time(tmp_path):
    tracemalloc.start()
    try:
        summary = generate_mlp(tmp_path / "big.bpk", 32 * MiB, width=1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    layer_bytes = 1024 * 1024 * 4
    assert summary.layers > 6
    assert peak < 2 * layer_bytes


def test_generate_mlp_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="activation"):
        generate_mlp(tmp_path / "x.bpk", MiB, activation="tanh")
    with pytest.raises(ValueError, match="size_bytes"):
        generate_mlp(tmp_path / "x.bpk", 0)
    with pytest.raises(ValueError, match="width"):
        generate_mlp(tmp_path / "x.bpk", MiB, width=0)


def test_a_stacked_batch_answers_each_input_as_it_would_alone(tmp_path):
    path = tmp_path / "m.bpk"
    generate_mlp(path, 1 << 20)
    loaded = LoadedModel(str(path), None, "mmap")
    width = loaded.describe()["inputs"][0]["shape"][1]
    rng = np.random.default_rng(0)
    inputs = [rng.random((2, width), np.float32), rng.random(width, dtype=np.float32),
              np.zeros((1, 3), np.float32), {"input": rng.random((3, width), np.float32)}]
    results = batch_outcomes(loaded, inputs)
    assert loaded.batching
    assert isinstance(results[2], ModelInputError)  # fails alone
    for one, result in zip(inputs[:2] + inputs[3:], results[:2] + results[3:], strict=True):
        np.testing.assert_allclose(result, loaded.infer(one), rtol=1e-5, atol=1e-6)



def test_a_request_larger_than_a_pass_runs_in_passes_even_when_one_fails(tmp_path):
    """Its failing pass is its answer: it is never run again whole, past --max-batch."""
    path = tmp_path / "m.bpk"
    generate_mlp(path, 1 << 20)
    loaded = LoadedModel(str(path), "batch_model:poisoned", "mmap", max_rows=4)
    rows = np.ones((10, 4), np.float32)
    rows[5, 0] = 7
    fine = np.ones((3, 4), np.float32)
    alone, = batch_outcomes(loaded, [rows])
    assert isinstance(alone, ValueError) and loaded.model.most_rows == 4
    stacked = batch_outcomes(loaded, [fine, rows])
    assert isinstance(stacked[1], ValueError) and loaded.model.most_rows == 4
    np.testing.assert_array_equal(stacked[0], fine * 2)


def test_a_bare_row_keeps_its_own_output_shape_when_the_output_is_undeclared(tmp_path):
    path = tmp_path / "m.bpk"
    generate_mlp(path, 1 << 20)
    loaded = LoadedModel(str(path), "batch_model:undeclared_output", "mmap")
    bare, row = np.ones(4, np.float32), np.ones((1, 4), np.float32)
    results = batch_outcomes(loaded, [bare, row, bare, row])
    assert [r.shape for r in results] == [(4,), (1, 4), (4,), (1, 4)]


def test_float64_input_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "m.bpk"
    generate_mlp(path, 1 << 20)
    loaded = LoadedModel(str(path), None, "mmap")
    width = loaded.describe()["inputs"][0]["shape"][1]
    with pytest.raises(ModelInputError, match=r"send x\.astype\(np\.float32\)"):
        loaded.infer(np.ones((1, width)))


def test_a_bare_row_reaches_a_model_with_declared_outputs_with_its_batch_axis(tmp_path):
    """The README's own model: ``x @ w`` on a bare row would give ``[2]`` where ``[1, 2]`` is
    declared. It is handed ``[1, 3]``, alone or stacked, and answers the same either way."""
    (tmp_path / "linear_model.py").write_text(
        "import numpy as np\n"
        "class Linear:\n"
        "    input_shape, input_dtype = (None, 3), np.float32\n"
        "    output_shape, output_dtype = (None, 2), np.float32\n"
        "    batching = True\n"
        "    def __init__(self, weights):\n"
        "        self.w, self.b = weights['w'], weights['b']\n"
        "    def __call__(self, x):\n"
        "        return x @ self.w + self.b\n"
        "def factory(weights, metadata):\n"
        "    return Linear(weights)\n")
    path = tmp_path / "linear.bpk"
    burnpack.write(path, {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)})
    sys.path.insert(0, str(tmp_path))
    try:
        loaded = LoadedModel(str(path), "linear_model:factory", "mmap")
    finally:
        sys.path.remove(str(tmp_path))
    bare, rows = np.ones(3, np.float32), np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(loaded.infer(bare), [[3, 3]])
    alone, = batch_outcomes(loaded, [bare])
    stacked = batch_outcomes(loaded, [bare, rows])
    np.testing.assert_array_equal(alone, [[3, 3]])
    np.testing.assert_array_equal(stacked[0], [[3, 3]])
    np.testing.assert_array_equal(stacked[1], [[3, 3], [3, 3]])
