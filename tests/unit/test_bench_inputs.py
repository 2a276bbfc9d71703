"""``benchlib.inputs``: the requests a benchmark makes from a model's ``info`` are what the
model's contract admits, whatever form of input the model declares."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from benchlib.inputs import OPEN_AXIS, NoInput, requests_for

from workerpool.models import Contract


def contract_of(**declared: object) -> Contract:
    return Contract.of(SimpleNamespace(**declared), "m")


@pytest.mark.parametrize("declared", [
    {"input_shape": (None, 28, 28), "input_dtype": np.float32, "also_accepted": (np.uint8,)},
    {"input_shape": (None, 16), "input_dtype": np.float32},
    {"input_shape": (4, 16), "input_dtype": np.int32},
    {"input_shape": {"input_ids": (None, None), "attention_mask": (None, None)},
     "input_dtype": {"input_ids": np.int64, "attention_mask": np.int64}},
    {"input_shape": {"x": (None, 3)}, "input_dtype": {"x": np.float16}},
])
def test_every_request_made_of_a_declared_array_input_is_admitted(declared):
    contract = contract_of(**declared)
    requests = requests_for({"model": "m", **contract.info()})
    assert len(requests) == 1
    assert contract.check_input(requests[0]) in (1, None)


def test_an_open_axis_past_the_batch_axis_gets_a_few_positions():
    info = contract_of(input_shape={"ids": (None, None)}, input_dtype={"ids": np.int64}).info()
    (request,) = requests_for(info)
    assert isinstance(request, dict) and request["ids"].shape == (1, OPEN_AXIS)
    assert request["ids"].dtype == np.int64 and (request["ids"] == 1).all()


def test_a_model_that_takes_texts_is_sent_one_sentence_at_a_time():
    contract = contract_of(accepts_text=True, input_shape={"input_ids": (None, None)},
                           input_dtype={"input_ids": np.int64})
    requests = requests_for(contract.info())
    assert len(requests) > 1
    assert all(isinstance(r, list) and len(r) == 1 and isinstance(r[0], str) for r in requests)
    assert all(contract.check_input(r) == 1 for r in requests)


@pytest.mark.parametrize("declared, says", [
    ({}, "of any dtype"),
    ({"input_dtype": np.float32}, "of any shape"),
])
def test_an_input_that_declares_no_form_is_refused_naming_what_is_missing(declared, says):
    with pytest.raises(NoInput, match=says):
        requests_for(contract_of(**declared).info())


def test_a_model_with_no_input_at_all_is_refused():
    with pytest.raises(NoInput, match="declares no input"):
        requests_for({"model": "m", "inputs": []})
