"""Answering requests inside a worker: decode, run the model, encode the reply.

The router gives a worker one request, or a batch of them, at a time, for one model, and it
runs inline: no thread hand-off on the hot path. A request may be a part of a client's request
(some of its texts, or rows): it is answered as one, the router puts the parts together. A batch is validated request by request, run in the passes
the model's batching forms (which groups the requests that fit together) and answered request
by request, each as soon as its pass is done. An HTTP request's body is decoded and its
response body encoded here too (``codecs.http_call``), not in the supervisor. Every failure
becomes an error reply, never an exception.

An answer is the reply's status (``b"ok"`` or the error code, which the router counts without
decoding the reply) and its frames.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from .. import models
from ..codecs.http_call import HttpCall, decode_call
from ..codecs.view import ModelView, view_of
from ..errors import ErrorCode, RemoteError, exception_text
from ..models.loaded import LoadedModel
from ..models.texts import TextEncoder
from ..protocol import messages as protocol

log = logging.getLogger(__name__)

OK = b"ok"
PART = struct.Struct("<II")  # the rows or texts [start, stop) of a request a message carries
Answer = tuple[bytes, list[Any]]
Decoded = protocol.Message | HttpCall  # what the model can run
Request = tuple[Sequence[Any], protocol.Part | None]  # its frames, and the part of it they carry


def read_part(frame: Any) -> protocol.Part | None:
    """The part of its request a message carries: None for the whole of it (an empty frame)."""
    data = protocol.buffer_of(frame)
    return PART.unpack(data) if data.nbytes == PART.size else None


def handle_batch(loaded: LoadedModel | None, requests: Sequence[Request]) -> Iterator[tuple[int, Answer]]:
    """Answer each request of a batch, as soon as its answer is known: the index of the request
    and its answer. Every failure becomes an error reply, never an exception: no message, and
    nothing the model raises or returns, takes the worker down. The ``infer`` requests run in the
    passes :meth:`LoadedModel.infer_batch` forms. ``loaded`` None: the model the router named is not served here (it was just
    removed): each is answered so."""
    if loaded is None:
        for index, (frames, _) in enumerate(requests):
            yield index, _Replies.unserved(frames)
        return
    runnable: list[tuple[int, Decoded]] = []
    reply = _Replies(loaded)
    for index, (frames, part) in enumerate(requests):
        decoded = _decoded(reply, frames, part)
        if isinstance(decoded, HttpCall) and decoded.tokenizes:
            yield index, reply.tokens(decoded)
        elif isinstance(decoded, HttpCall) or (isinstance(decoded, protocol.Message)
                                             and decoded.header["method"] == protocol.METHOD_INFER):
            runnable.append((index, decoded))
        elif isinstance(decoded, protocol.Message):
            yield index, reply.ok(decoded.id, None, info=loaded.describe())
        else:
            yield index, decoded
    unanswered = dict(enumerate(runnable))
    payloads = [one.payload if isinstance(one, HttpCall) else one.payload() for _, one in runnable]
    for k, outcome in loaded.infer_batch(payloads):
        if k in unanswered:  # each once
            index, decoded = unanswered.pop(k)
            yield index, reply.answer(decoded, outcome)
    for index, decoded in unanswered.values():  # a model's bug, but no request goes unanswered
        log.error("request %r of a batch got no answer from the model", decoded.id)
        yield index, reply.error(decoded.id, ErrorCode.INTERNAL, "the model gave no answer for this request")


def _decoded(reply: _Replies, frames: Sequence[Any], part: protocol.Part | None) -> Decoded | Answer:
    """The request in ``frames``, an HTTP one's body read against the model; or the error
    answer when it cannot be."""
    try:
        message = protocol.decode_request(frames, part)
        return decode_call(message, reply.view) if "http" in message.header else message
    except protocol.ProtocolError as exc:
        return reply.error(exc.request_id, ErrorCode.BAD_REQUEST, str(exc))
    except RemoteError as exc:  # an HTTP body that does not fit the model
        return reply.error(message.id, ErrorCode.read(exc.code.encode()), exc.message)
    except Exception as exc:  # out of memory while decoding, say: the worker stays
        log.exception("request could not be decoded")
        return reply.error(None, ErrorCode.INTERNAL, exception_text(exc, named=True, folded=False))


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


class _Replies:
    """Replies that name this worker and the generation it serves."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.pid, self.generation = os.getpid(), loaded.generation

    def view(self, name: str) -> ModelView:
        """The model as the HTTP protocols describe it, served as ``name``."""
        return _view(self.loaded, name)

    def ok(self, request_id: Any, outputs: Any, **extra: Any) -> Answer:
        return OK, protocol.encode_reply(
            request_id, outputs, worker_pid=self.pid, generation=self.generation, **extra
        )

    def error(self, request_id: Any, code: ErrorCode, message: str) -> Answer:
        return code.encode(), protocol.encode_error(
            request_id, code, message, worker_pid=self.pid, generation=self.generation
        )

    @staticmethod
    def unserved(frames: Sequence[Any]) -> Answer:
        """The answer to a request for a model this worker does not serve."""
        request_id = protocol.request_id_of(frames[1]) if len(frames) > 1 else None
        return ErrorCode.MODEL_NOT_FOUND.encode(), protocol.encode_error(
            request_id, ErrorCode.MODEL_NOT_FOUND, "the model was removed while the request waited",
            worker_pid=os.getpid())

    def tokens(self, call: HttpCall) -> Answer:
        """The answer to a request for its texts' tokens, as the model's tokenizer makes them."""
        encoder = getattr(self.loaded.model, "text_encoder", None)
        if not isinstance(encoder, TextEncoder) or not isinstance(call.payload, list):
            return self.error(call.id, ErrorCode.BAD_REQUEST, f"the model {self.loaded.name} has no tokenizer")
        try:
            tokenized = encoder.tokenize(call.payload, special=call.options.get("special") is not False)
        except models.ModelInputError as exc:
            return self.error(call.id, ErrorCode.BAD_REQUEST, str(exc))
        return OK, call.reply_tokens(tokenized, worker_pid=self.pid, generation=self.generation)

    def answer(self, decoded: Decoded, outcome: Any) -> Answer:
        """The reply for what the model returned or raised (see :meth:`LoadedModel.outcome`)."""
        loaded, request_id = self.loaded, decoded.id
        if isinstance(outcome, models.ModelInputError):
            return self.error(request_id, ErrorCode.BAD_REQUEST, str(outcome))
        if isinstance(outcome, models.ModelOutputError):
            return self.error(request_id, ErrorCode.INTERNAL, _misfit(loaded, str(outcome)))
        if isinstance(outcome, BaseException):
            return self.error(request_id, ErrorCode.INTERNAL, _model_failed(request_id, outcome))
        try:
            if isinstance(decoded, HttpCall):
                return OK, decoded.reply(outcome, worker_pid=self.pid, generation=self.generation)
            return self.ok(request_id, outcome)
        except RemoteError as exc:  # outputs the HTTP client asked for in a form that cannot carry them
            return self.error(request_id, ErrorCode.read(exc.code.encode()), exc.message)
        except protocol.ProtocolError as exc:  # an undeclared output that cannot cross the wire
            problem = f"model {loaded.name}'s output cannot be sent: {exc}"
            return self.error(request_id, ErrorCode.INTERNAL, _misfit(loaded, problem))
        except Exception as exc:  # noqa: BLE001 - a codec bug: this request fails, the worker serves the next
            return self.error(request_id, ErrorCode.INTERNAL, failed(request_id, exc, "its reply could not be written"))


def _view(loaded: LoadedModel, name: str) -> ModelView:
    """The view of ``loaded`` served as ``name``, built once per model (and so generation)."""
    view = loaded.views.get(name)
    if view is None:
        view = loaded.views[name] = view_of(name, loaded.describe(), loaded.generation)
    return view


def _misfit(loaded: LoadedModel, problem: str) -> str:
    """Log, once per model in this worker, that it broke what it declares; the reply's message."""
    if not loaded.misfit_logged:
        loaded.misfit_logged = True
        log.error("worker %d: %s; every such request is answered 'internal' (logged once)",
                  os.getpid(), problem)
    return problem


def failed(request_id: Any, exc: BaseException, what: str) -> str:
    """Log, with its traceback, what went wrong with a request beyond what the checks catch (a
    bug in a codec or in the worker); the reply's message."""
    log.error("request %r: %s", request_id, what, exc_info=exc, extra={"request_id": request_id})
    return f"{what}: {exception_text(exc, named=True, folded=False)}"


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
