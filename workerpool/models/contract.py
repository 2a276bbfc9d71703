"""What a model declares it takes and returns, checked around every call in a worker.

A model may declare ``input_shape`` and ``input_dtype`` (plus ``also_accepted`` dtypes), and
``output_shape`` and ``output_dtype``; ``None`` in a shape is an axis of any size, and a
leading ``None`` is the batch axis. A model that takes named arrays declares ``input_shape``
and ``input_dtype`` as mappings from name to value: a request then sends exactly those names,
with one batch size along their batch axes (a single named input may come as a bare array). A
model that returns named arrays declares ``output_shape`` (and ``output_dtype``, or one dtype
for all) as a mapping from name to value.
A model that also takes a list of strings says ``accepts_text = True``, and may declare what it
returns for texts as ``text_output_shape`` and ``text_output_dtype``, in the same forms.

The input is checked before the model runs, so a request that does not fit is the client's
error, answered before numpy allocates anything for it; this is the only check of a request's
form (built-in models declare theirs and check nothing: :class:`~.base.Model`). The output is
checked before it is sent, so a model that breaks its own declaration is never mistaken for a
success. What a model does not declare is not checked, except that its output must be arrays.
Texts sent to a model that declares an array input and takes no texts are refused with a
message saying so.

What is declared is also what ``info`` tells clients (:meth:`Contract.info`), in one format for
every model: ``inputs`` and ``outputs`` are lists of ``{"name", "dtype", "shape"}``, the dtype
as the wire's array descriptors write it (``"<f4"``) or ``"text"``, None where undeclared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .base import INPUT_NAME, ModelError, ModelInputError, Shape, format_shape

TEXT = "text"  # the dtype ``info`` gives a list of strings


class ModelOutputError(Exception):
    """A model returned something other than what it declares: its bug, not the client's."""


@dataclass(frozen=True)
class Declared:
    """One declared array: a shape (``None`` for an axis of any size) and dtypes, each optional."""

    shape: Shape | None
    dtypes: tuple[np.dtype, ...]

    def fits(self, array: np.ndarray, batch: int | None = None, *, unbatched: bool = False) -> bool:
        """Whether ``array`` has a declared dtype and the declared shape, its batch axis of size
        ``batch`` when given, or without its batch axis when ``unbatched``."""
        if self.dtypes and array.dtype not in self.dtypes:
            return False
        if self.shape is None:
            return True
        shape = self.shape[1:] if unbatched else self.with_batch(batch)
        return len(array.shape) == len(shape) and all(
            d is None or d == s for s, d in zip(array.shape, shape)
        )

    @property
    def has_batch(self) -> bool:
        """Whether the declared shape starts with the batch axis (``None``)."""
        return self.shape is not None and self.shape[:1] == (None,)

    def with_batch(self, batch: int | None) -> Shape:
        """The declared shape, with its batch axis fixed to ``batch`` when that is known."""
        assert self.shape is not None
        return self.shape if batch is None or not self.has_batch else (batch, *self.shape[1:])

    def describe(self, batch: int | None = None) -> str:
        dtypes = " or ".join(map(str, self.dtypes)) or "any dtype"
        shape = "of any shape" if self.shape is None else format_shape(self.with_batch(batch))
        return f"{dtypes} {shape}"

    def entry(self, name: str | None) -> dict[str, Any]:
        """This array as ``info`` lists it (see :meth:`Contract.info`)."""
        first, *others = self.dtypes or (None,)
        entry = _entry(name, None if first is None else first.str, self.shape)
        if others:
            entry["also_accepted"] = [dtype.str for dtype in others]
        return entry


@dataclass(frozen=True)
class Contract:
    """A model's declared input and outputs, read once when the model is built."""

    model: str
    input: Declared | None  # None: nothing declared
    outputs: Mapping[str | None, Declared] | None  # by name; the None key: one unnamed output
    texts: bool = False  # the model takes a list of strings too
    text_outputs: Mapping[str | None, Declared] | None = None  # what it returns for texts
    named: Mapping[str, Declared] | None = None  # named inputs, declared instead of ``input``

    @classmethod
    def of(cls, model: Any, name: str) -> Contract:
        """Read what ``model`` declares; one that cannot be read is a :class:`ModelError`."""
        try:
            named = _named_inputs_of(model)
            return cls(name, None if named else _input_of(model), _outputs_of(model),
                       bool(getattr(model, "accepts_text", False)), _outputs_of(model, "text_"),
                       named)
        except (TypeError, ValueError) as exc:
            raise ModelError(f"model {name!r} declares an unreadable signature: {exc}") from exc

    def info(self) -> dict[str, list[dict[str, Any]]]:
        """The ``inputs`` and ``outputs`` that ``info`` tells clients, and that new weights or
        another host's model must match: one ``{"name", "dtype", "shape"}`` per array (name None
        for the single unnamed one), texts as dtype ``"text"``, None for what is undeclared.

        The outputs are those of the array input, then those texts give that the array input
        does not (an ONNX encoder's ``embedding`` beside its token states); a model that
        declares only what texts give (bert) lists those.
        """
        undeclared = _entry(None, None, None)
        inputs = [_entry(None, TEXT, (None,))] if self.texts else []
        if self.named is not None:
            inputs.extend(declared.entry(name) for name, declared in self.named.items())
        elif self.input is not None:
            inputs.append(self.input.entry(None))
        elif not self.texts:
            inputs.append(undeclared)
        only_texts = self.texts and self.input is None and self.named is None and self.outputs is None
        outputs = self.text_outputs if only_texts else self.outputs
        if outputs is None:
            return {"inputs": inputs, "outputs": [undeclared]}
        if self.texts and self.text_outputs is not None:
            outputs = {**outputs, **{name: declared for name, declared in self.text_outputs.items()
                                     if name is not None and name not in outputs}}
        return {"inputs": inputs, "outputs": [declared.entry(name) for name, declared in outputs.items()]}

    @property
    def batched(self) -> bool:
        """Every input has a declared batch axis, so requests can be stacked along it."""
        if self.named is not None:
            return all(declared.has_batch for declared in self.named.values())
        return self.input is not None and self.input.shape is not None and self.input.has_batch

    def as_batch(self, inputs: Any) -> tuple[np.ndarray | dict[str, np.ndarray], bool]:
        """The input array (named inputs: arrays by name) of a model with a batch axis, with
        that axis, and whether it was a bare row (which gets one); :class:`ModelInputError` as
        :meth:`check_input` raises it."""
        bare = self._checked(inputs)[1]
        if self.named is not None:
            arrays = self._by_name(inputs)
            return ({n: a[np.newaxis] for n, a in arrays.items()} if bare else arrays), bare
        array: np.ndarray = inputs[INPUT_NAME] if isinstance(inputs, Mapping) else inputs
        return (array[np.newaxis] if bare else array), bare

    def admit(self, inputs: Any) -> tuple[int | None, Any]:
        """The batch size of ``inputs``, checked once as :meth:`check_input` checks them, and
        ``inputs`` as the model receives them.

        Where the outputs are declared, and so checked with the batch axis, a bare row gets
        that axis: the model sees the shape it declares, whether the row runs alone or stacked
        with others. Otherwise the model sees the row as sent and answers it as it likes (the
        row then always runs alone). Named inputs reach the model as arrays by name, a bare
        array under the single input's name.
        """
        batch, bare = self._checked(inputs)
        if isinstance(inputs, list):
            return batch, inputs
        grow = bare and self.outputs is not None
        if self.named is not None:
            arrays = self._by_name(inputs)
            return batch, ({n: a[np.newaxis] for n, a in arrays.items()} if grow else arrays)
        if not grow:
            return batch, inputs
        if isinstance(inputs, Mapping):
            return batch, {INPUT_NAME: inputs[INPUT_NAME][np.newaxis]}
        return batch, inputs[np.newaxis]

    def check_input(self, inputs: Any) -> int | None:
        """The batch size of an input that fits the declaration (None: no batch axis declared).

        One array is expected, bare or named ``input``; without its batch axis it is a batch of
        one, as built-in models take it. Named inputs are checked by :meth:`_check_named`.
        Texts are a batch of their number for a model that takes them. Raises
        :class:`ModelInputError` for anything else.
        """
        return self._checked(inputs)[0]

    def _checked(self, inputs: Any) -> tuple[int | None, bool]:
        """:meth:`check_input`'s batch size, and whether ``inputs`` is a bare row (a batch of
        one without its batch axis)."""
        declared = self.input
        if isinstance(inputs, list) and self.texts:
            return len(inputs), False
        if isinstance(inputs, list) and (declared or self.named) is not None:
            raise ModelInputError(f"the model {self.model} takes arrays, not texts: send "
                                  f"{self._expected()} (workerpool infer)")
        if self.named is not None:
            return self._check_named(inputs, self.named)
        if declared is None:
            return None, False
        array = inputs
        if isinstance(inputs, Mapping):
            if set(inputs) != {INPUT_NAME}:
                raise self._refuse(declared, f"{_describe(inputs)} (only {INPUT_NAME!r} is known)")
            array = inputs[INPUT_NAME]
        if not isinstance(array, np.ndarray):
            raise self._refuse(declared, _describe(array))
        if declared.fits(array):
            return (array.shape[0] if declared.has_batch else None), False
        if declared.has_batch and declared.fits(array, unbatched=True):
            return 1, True
        raise self._refuse(declared, _describe(array))

    def _check_named(self, inputs: Any, named: Mapping[str, Declared]) -> tuple[int | None, bool]:
        """The batch size of named inputs, and whether they are a bare row: exactly the declared
        names, each array as declared, one size along their batch axes; a single input may be a
        bare array, or a bare row."""
        if not isinstance(inputs, Mapping) and len(named) == 1:
            inputs = {next(iter(named)): inputs}
        if not isinstance(inputs, Mapping) or set(inputs) != set(named):
            raise ModelInputError(f"{self.model}: expected {self._expected()}, got {_describe(inputs)}")
        batches = {}
        for name, declared in named.items():
            array = inputs[name]
            if isinstance(array, np.ndarray) and declared.fits(array):
                if declared.has_batch:
                    batches[name] = array.shape[0]
            elif len(named) == 1 and isinstance(array, np.ndarray) and declared.has_batch \
                    and declared.fits(array, unbatched=True):
                return 1, True
            else:
                raise self._refuse(declared, _describe(array), f"{name} ", rows=len(named) == 1)
        if len(set(batches.values())) > 1:
            sizes = ", ".join(f"{name} {size}" for name, size in batches.items())
            raise ModelInputError(f"{self.model}: the inputs' batch sizes differ ({sizes})")
        return (next(iter(batches.values()), None) if self.batched else None), False

    def _by_name(self, inputs: Any) -> dict[str, np.ndarray]:
        """Checked named inputs as arrays by name (a bare array under the single input's name)."""
        assert self.named is not None
        return dict(inputs) if isinstance(inputs, Mapping) else {next(iter(self.named)): inputs}

    def _expected(self) -> str:
        """What the model takes, for a refusal: its input's forms, or its named arrays."""
        if self.named is None:
            assert self.input is not None
            return self._forms(self.input)
        arrays = ", ".join(f"{name} {declared.describe()}" for name, declared in self.named.items())
        return f"arrays named {arrays}"

    def check_output(self, outputs: Any, batch: int | None, *, texts: bool = False) -> None:
        """Raise :class:`ModelOutputError` unless ``outputs`` are arrays as declared (for texts,
        when ``texts``), with the batch size of the input."""
        expected = self.text_outputs if texts and self.texts else self.outputs
        if expected is None:
            if not _are_arrays(outputs):
                raise self._misfit(f"{_describe(outputs)}, not an array or named arrays")
        elif None in expected:
            self._check_array("", outputs, expected[None], batch)
        elif not isinstance(outputs, Mapping) or set(outputs) != set(expected):
            names = sorted(map(str, expected))
            raise self._misfit(f"{_describe(outputs)}, declared arrays named {names}")
        else:
            for name, declared in expected.items():
                self._check_array(f"{name}: ", outputs[name], declared, batch)

    def _check_array(self, label: str, value: Any, declared: Declared, batch: int | None) -> None:
        """One output array: its dtype and shape, its batch axis the input's."""
        if not isinstance(value, np.ndarray) or not declared.fits(value, batch):
            raise self._misfit(f"{label}{_describe(value)}, declared {declared.describe(batch)}")

    def _refuse(self, declared: Declared, got: str, label: str = "", *,
                rows: bool = True) -> ModelInputError:
        hint = ""
        if got.startswith("float64") and np.dtype(np.float32) in declared.dtypes:
            hint = " (numpy makes float64 by default: send x.astype(np.float32))"
        return ModelInputError(f"{self.model}: expected {label}{self._forms(declared, rows=rows)}, "
                               f"got {label}{got}{hint}")

    @staticmethod
    def _forms(declared: Declared, *, rows: bool = True) -> str:
        """``float32 [B, 16] or [16]``: the input with its batch axis, and a bare row (when
        ``rows``)."""
        forms = declared.describe()
        if rows and declared.shape is not None and declared.has_batch:
            forms += f" or {format_shape(declared.shape[1:], batch_axis=False)}"
        return forms

    def _misfit(self, what: str) -> ModelOutputError:
        return ModelOutputError(f"model {self.model} returned {what}")


def array_input(info: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The array input whose shape an ``info`` declares, if any."""
    for entry in info.get("inputs") or ():
        if entry.get("dtype") != TEXT and entry.get("shape") is not None:
            return cast(Mapping[str, Any], entry)
    return None


def takes_text(info: Mapping[str, Any]) -> bool:
    """Whether an ``info`` says the model takes a list of strings."""
    return any(entry.get("dtype") == TEXT for entry in info.get("inputs") or ())


def format_entries(entries: Any) -> str:
    """``embedding <f4 [None, 384]``: an ``info``'s inputs or outputs on one line, whatever a
    worker sent."""
    if not isinstance(entries, list):
        return repr(entries)
    return ", ".join(_format_entry(entry) for entry in entries)


def _format_entry(entry: Any) -> str:
    if not isinstance(entry, Mapping):
        return repr(entry)
    dtype, shape = entry.get("dtype"), entry.get("shape")
    parts = [entry.get("name"), "any dtype" if dtype is None else dtype,
             "any shape" if shape is None else shape]
    return " ".join(str(part) for part in parts if part is not None)


def _entry(name: str | None, dtype: str | None, shape: Shape | None) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": None if shape is None else list(shape)}


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {format_shape(value.shape)}"
    if isinstance(value, Mapping):
        return f"arrays named {sorted(map(str, value))}"
    return "nothing" if value is None else f"a {type(value).__name__}"


def _are_arrays(outputs: Any) -> bool:
    if isinstance(outputs, Mapping):
        return bool(outputs) and all(isinstance(v, np.ndarray) for v in outputs.values())
    return isinstance(outputs, np.ndarray)


def _shape(value: Any) -> Shape:
    return tuple(None if d is None else int(d) for d in value)


def _named_inputs_of(model: Any) -> dict[str, Declared] | None:
    """The named inputs declared as mappings ``input_shape`` and ``input_dtype``, if any."""
    shape, dtype = getattr(model, "input_shape", None), getattr(model, "input_dtype", None)
    if not isinstance(shape, Mapping) and not isinstance(dtype, Mapping):
        return None
    if not isinstance(shape, Mapping) or not isinstance(dtype, Mapping) or set(shape) != set(dtype):
        raise ValueError("input_shape and input_dtype must name the same inputs")
    return {str(name): _declared(shape[name], dtype[name]) for name in shape}


def _input_of(model: Any) -> Declared | None:
    shape, dtype = getattr(model, "input_shape", None), getattr(model, "input_dtype", None)
    if shape is None and dtype is None:
        return None
    accepted = _dtypes(dtype)
    if accepted:
        accepted += tuple(map(np.dtype, getattr(model, "also_accepted", ())))
    return Declared(None if shape is None else _shape(shape), accepted)


def _outputs_of(model: Any, prefix: str = "") -> dict[str | None, Declared] | None:
    """The outputs declared as ``{prefix}output_shape`` and ``{prefix}output_dtype``."""
    shape_key, dtype_key = f"{prefix}output_shape", f"{prefix}output_dtype"
    shape, dtype = getattr(model, shape_key, None), getattr(model, dtype_key, None)
    if shape is None and dtype is None:
        return None
    if not isinstance(shape, Mapping):
        if isinstance(dtype, Mapping):
            raise TypeError(f"{dtype_key} names outputs but {shape_key} does not")
        return {None: _declared(shape, dtype)}
    dtypes = dtype if isinstance(dtype, Mapping) else dict.fromkeys(shape, dtype)
    if set(dtypes) != set(shape):
        raise ValueError(f"{dtype_key} names {sorted(dtypes)}, {shape_key} {sorted(shape)}")
    return {str(name): Declared(_shape(shape[name]), _dtypes(dtypes[name])) for name in shape}


def _declared(shape: Any, dtype: Any) -> Declared:
    return Declared(None if shape is None else _shape(shape), _dtypes(dtype))


def _dtypes(dtype: Any) -> tuple[np.dtype, ...]:
    return () if dtype is None else (np.dtype(dtype),)
