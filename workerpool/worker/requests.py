"""Answering requests inside a worker: decode, run the model, encode the reply.

The router gives a worker one request, or a batch of compatible ones, at a time and it runs
inline: no thread hand-off on the hot path. A batch is validated request by request, run in
the passes the model's batching forms and answered request by request, each as soon as its
pass is done. Every failure becomes an error reply, never an exception.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from .. import models
from ..errors import exception_text
from ..models.loaded import LoadedModel
from ..protocol import messages as protocol

log = logging.getLogger(__name__)


def handle_request(loaded: LoadedModel, frames: Sequence[Any]) -> tuple[bool, list[Any]]:
    """Run one request; every failure becomes an error reply, never an exception: no message,
    and nothing the model raises or returns, takes the worker down."""
    reply = _Replies(loaded.generation)
    try:
        message = protocol.decode_request(frames)
    except protocol.ProtocolError as exc:
        return reply.error(exc.request_id, "bad_request", str(exc))
    except Exception as exc:  # out of memory while decoding, say: the worker stays
        log.exception("request could not be decoded")
        return reply.error(None, "internal", exception_text(exc, named=True, folded=False))
    if message.header["method"] == protocol.METHOD_INFO:
        return reply.ok(message.id, None, info=loaded.describe())
    return _infer(loaded, message, reply)


def handle_batch(loaded: LoadedModel,
                 requests: Sequence[Sequence[Any]]) -> Iterator[tuple[int, tuple[bool, list[Any]]]]:
    """Answer each request of a batch as :func:`handle_request` would, as soon as its answer is
    known: the index of the request and its reply. The ones that decode as ``infer`` requests
    run in the passes :meth:`LoadedModel.infer_batch` forms."""
    runnable: list[tuple[int, protocol.Message]] = []
    reply = _Replies(loaded.generation)
    for index, frames in enumerate(requests):
        try:
            message = protocol.decode_request(frames)
        except Exception:  # noqa: BLE001 - handle_request answers it alone, as any request
            yield index, handle_request(loaded, frames)
            continue
        if message.header["method"] == protocol.METHOD_INFER:
            runnable.append((index, message))
        else:
            yield index, handle_request(loaded, frames)
    unanswered = dict(enumerate(runnable))
    for k, outcome in loaded.infer_batch([message.payload() for _, message in runnable]):
        if k in unanswered:  # each once
            index, message = unanswered.pop(k)
            yield index, _answer(loaded, message.id, reply, outcome)
    for index, message in unanswered.values():  # a model's bug, but no request goes unanswered
        log.error("request %r of a batch got no answer from the model", message.id)
        yield index, reply.error(message.id, "internal", "the model gave no answer for this request")


def in_batch_order(answers: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    """``answers`` (index, answer), each as soon as it and every one before it have come: the
    router takes a batch's replies in the batch's order."""
    held: dict[int, Any] = {}
    following = 0
    for index, answer in answers:
        held[index] = answer
        while following in held:
            yield following, held.pop(following)
            following += 1


def _infer(
    loaded: LoadedModel, message: protocol.Message, reply: _Replies
) -> tuple[bool, list[Any]]:
    """Run the model on a decoded request: input and output checked, whatever it raises caught."""
    return _answer(loaded, message.id, reply, loaded.outcome(message.payload()))


def _answer(loaded: LoadedModel, request_id: Any, reply: _Replies, outcome: Any) -> tuple[bool, list[Any]]:
    """The reply for what the model returned or raised (see :meth:`LoadedModel.outcome`)."""
    if isinstance(outcome, models.ModelInputError):
        return reply.error(request_id, "bad_request", str(outcome))
    if isinstance(outcome, models.ModelOutputError):
        return reply.error(request_id, "internal", _misfit(loaded, str(outcome)))
    if isinstance(outcome, BaseException):
        return reply.error(request_id, "internal", _model_failed(request_id, outcome))
    try:
        return reply.ok(request_id, outcome)
    except protocol.ProtocolError as exc:  # an undeclared output that cannot cross the wire
        problem = f"model {loaded.name}'s output cannot be sent: {exc}"
        return reply.error(request_id, "internal", _misfit(loaded, problem))


class _Replies:
    """Replies that name this worker and the generation it serves."""

    def __init__(self, generation: int) -> None:
        self.pid, self.generation = os.getpid(), generation

    def ok(self, request_id: Any, outputs: Any, **extra: Any) -> tuple[bool, list[Any]]:
        return True, protocol.encode_reply(
            request_id, outputs, worker_pid=self.pid, generation=self.generation, **extra
        )

    def error(self, request_id: Any, code: str, message: str) -> tuple[bool, list[Any]]:
        return False, protocol.encode_error(
            request_id, code, message, worker_pid=self.pid, generation=self.generation
        )


def _misfit(loaded: LoadedModel, problem: str) -> str:
    """Log, once per model in this worker, that it broke what it declares; the reply's message."""
    if not loaded.misfit_logged:
        loaded.misfit_logged = True
        log.error("worker %d: %s; every such request is answered 'internal' (logged once)",
                  os.getpid(), problem)
    return problem


def _model_failed(request_id: Any, exc: BaseException) -> str:
    """Log what the model raised (with its traceback); the reply's message.

    A MemoryError's traceback holds the frames, and so the buffers, of the call that failed:
    it is dropped first, so that logging has memory to work with.
    """
    if isinstance(exc, MemoryError):
        exc.__traceback__ = None
        log.error("request %r failed: %s", request_id, exception_text(exc, named=True, folded=False), extra={"request_id": request_id})
    else:
        log.error("request %r failed", request_id, exc_info=exc, extra={"request_id": request_id})
    return exception_text(exc, named=True, folded=False)
