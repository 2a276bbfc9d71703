"""``infer`` and ``embed``: one request to a server, its answer printed or saved."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, cast

import zmq

from .. import security
from ..config import values
from ..endpoints import DEFAULT_BIND
from ..protocol import reach
from .arguments import add_settings, add_timeout, client_keys
from .failures import CommandError, reported
from .inputs import load_input
from .parser import Subcommands, add_command

if TYPE_CHECKING:
    from ..client.sync import Outputs


def add_infer(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_infer)
    parser.add_argument("--input", required=True, metavar="X.npy",
                        help="the input array (.npy, float32 for the built-in models), or named "
                        "input arrays (.npz)")
    parser.add_argument("--output", metavar="Y.npy",
                        help="write the output here (.npy) instead of printing it; named outputs "
                        "need an .npz name (Y.npz)")
    _add_client_options(parser, "infer")


def cmd_infer(args: argparse.Namespace) -> int:
    """send one request from a .npy file

    Send the array in a .npy file to a server and print or save the output.
    """
    if args.output:
        _check_writable(args.output)
    result = _request(args, load_input(args.input))
    if args.output:
        _save(args.output, result.outputs)
        print(f"workerpool: wrote {args.output} (worker {result.worker_pid}, generation {result.generation})")
    elif isinstance(result.outputs, dict):
        for name, array in result.outputs.items():
            print(f"{name}: {array.dtype} {list(array.shape)}\n{array}")
    else:
        print(result.outputs)
    return 0


def add_embed(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_embed)
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="the texts to embed")
    parser.add_argument("--output", metavar="E.npy", help="save the embeddings here instead of printing them")
    _add_client_options(parser, "embed")


def cmd_embed(args: argparse.Namespace) -> int:
    """embed texts with a server's sentence-embedding model

    Send the texts to a server whose model takes texts (such as 'bert' converted from a model folder
    with its tokenizer) and print one JSON list per text, or save them as one .npy array.
    """
    import numpy as np

    if args.output:
        _check_writable(args.output)
    outputs = _request(args, list(args.texts)).outputs
    embedding = outputs.get("embedding") if isinstance(outputs, dict) else None
    if not isinstance(embedding, np.ndarray):
        raise CommandError(f"{args.endpoint}: the server's model returned no 'embedding' for texts")
    if args.output:
        _save(args.output, embedding)
        print(f"workerpool: wrote {args.output} ({embedding.shape[0]} embeddings of {embedding.shape[1]})")
    else:
        for row in embedding:
            print(json.dumps([round(float(v), 7) for v in row]))
    return 0


def _add_client_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Where a one-request command sends its request, how long it waits, and its keys."""
    parser.add_argument("--endpoint", type=values.endpoint, default=DEFAULT_BIND, help="default: %(default)s")
    parser.add_argument("--model-name", metavar="NAME",
                        help="the model to ask, for a server that serves several (default: its only model)")
    add_timeout(parser, 30.0, "seconds per attempt")
    parser.add_argument("--retries", type=int, default=2, help="retries after a timeout (default: %(default)s)")
    add_settings(parser, command)


def _request(args: argparse.Namespace, payload: Any) -> Any:
    """One request to ``args.endpoint`` with the client options; its result, or one line."""
    from ..client.sync import Client
    from ..errors import Timeout, WorkerpoolError

    keys = client_keys(args)
    stuck = ("; the server is there (it completed a handshake) but did not answer: it is overloaded "
             "or stuck ('workerpool status' shows its queue and workers)")
    with (
        reported(security.KeysError, zmq.ZMQError, ValueError, saying=lambda exc: f"{args.endpoint}: {exc}"),
        reported(WorkerpoolError, saying=lambda exc: f"{args.endpoint}: {type(exc).__name__}: {exc}"),
        reported(Timeout, saying=lambda exc: f"{exc}{stuck}"),
        reported(reach.Unreachable),
    ):
        reach.check(args.endpoint, keys)
        with Client(args.endpoint, timeout=args.timeout, retries=args.retries, keys=keys) as client:
            return client.request(payload, model=args.model_name)


def _check_writable(path: str) -> None:
    """Refuse an output path that cannot be written before a request is sent for it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CommandError(f"{path}: not writable")


def _save(path: str, outputs: Outputs) -> None:
    """Named outputs as an .npz, one unnamed output (or none) as an .npy, at exactly ``path``:
    given a name, numpy would add its own extension to one without it. An archive is never
    written under an .npy name, nor anywhere the user did not name."""
    import numpy as np

    if isinstance(outputs, dict) and path.endswith(".npy"):
        raise CommandError(f"the model's outputs are named ({', '.join(outputs)}): an .npz archive "
                           f"holds them; give --output {path.removesuffix('.npy')}.npz (nothing was written)")
    with (
        reported(OSError, saying=lambda exc: f"{path}: cannot write it: {exc.strerror or exc}"),
        open(path, "wb") as f,
    ):
        if isinstance(outputs, dict):  # Any: numpy's stub types **kwds as allow_pickle
            np.savez(f, **cast(dict[str, Any], outputs))
        else:
            np.save(f, np.asanyarray(outputs))
