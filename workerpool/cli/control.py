"""``status``, ``reload`` and ``publish``: the commands that talk to a running server."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import cast

from .. import burnpack, runtime
from ..config import values
from ..config.models import ModelsError, list_models
from ..config.pool import RELOAD_TIMEOUT_SECONDS
from ..control import client as control
from ..control.status import Status, unready
from ..supervisor.ready_line import worker_count
from ..units import format_size
from . import render
from .arguments import add_control, add_model, add_source_and_destination, add_timeout
from .failures import CommandError, reported
from .parser import Subcommands, add_command

RELOAD_WAIT_SECONDS = RELOAD_TIMEOUT_SECONDS + 30.0
"""``reload`` outwaits the server's own reload deadline, so a failure arrives with its reason."""
STATUS_SECONDS = 5.0  # for publish's look at which file the running server serves


def control_endpoint(args: argparse.Namespace) -> str:
    """``--control``, else ``WORKERPOOL_CONTROL``, else where ``serve`` listens by default."""
    if args.control:
        return str(args.control)
    if os.environ.get("WORKERPOOL_CONTROL"):
        with reported(argparse.ArgumentTypeError, exit_code=2,
                      saying=lambda exc: f"WORKERPOOL_CONTROL={exc}"):
            return values.control_endpoint(os.environ["WORKERPOOL_CONTROL"])
    with reported(OSError, saying=lambda exc: f"cannot use the runtime directory: {exc}"):
        return runtime.default_control_endpoint()


def add_status(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_status)
    add_control(parser)
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    parser.add_argument("--explain", action="store_true",
                        help="say under the table what each memory column means")
    parser.add_argument("--ready", action="store_true",
                        help="exit 0 only if every model has a worker that can answer, no model's "
                        "file holds weights it refused, and the server is not shutting down (an exec "
                        "probe; /readyz over --http says the same)")
    add_timeout(parser, 5.0)


def cmd_status(args: argparse.Namespace) -> int:
    """show a running server's workers, queue and memory

    Ask a running server for its state. Exit 1 when no server answers.
    """
    endpoint = control_endpoint(args)
    with reported(control.ControlError):
        status = control.call(endpoint, "status", timeout=args.timeout, memory=not args.ready)
    if args.ready:
        reason = unready(cast(Status, status))
        print(f"workerpool: not ready: {reason}" if reason else "workerpool: ready",
              file=sys.stderr if reason else sys.stdout)
        return 1 if reason else 0
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    render.print_status(status, render.output_width(), explain=args.explain)
    return 0


def add_reload(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_reload)
    add_control(parser)
    add_timeout(parser, RELOAD_WAIT_SECONDS)


def cmd_reload(args: argparse.Namespace) -> int:
    """load new weights now and wait until every worker serves them

    Ask a running server to check its weight file now (as SIGHUP does) and wait until every worker
    serves the new generation. Exit 0 when they do or when the file is unchanged; exit 1 with the
    reason when the new file is refused or the switch does not complete.
    """
    endpoint = control_endpoint(args)
    with reported(control.ControlError, saying=lambda exc: f"reload failed: {exc}"):
        answer = control.call(endpoint, "reload", timeout=args.timeout)
    generations = (f"generation {answer['generation']}" if "generation" in answer else
                   ", ".join(f"generation {g} of {name}" for name, g in answer["generations"].items()))
    if answer["result"] == "unchanged":
        print(f"workerpool: weights unchanged; {generations} keeps serving")
    else:
        print(f"workerpool: every worker now serves {generations}")
    return 0


def add_models(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_models)
    parser.add_argument("action", nargs="?", choices=("list", "add", "remove"), default="list",
                        help="list the models served (the default), add one, or remove one")
    parser.add_argument("model", nargs="?", metavar="NAME=FILE|FILE|NAME",
                        help="add: the weight file to serve, named NAME (or after the file); remove: "
                        "the model's name")
    add_control(parser)
    add_timeout(parser, RELOAD_WAIT_SECONDS, "seconds to wait for every worker to serve an added model")


def cmd_models(args: argparse.Namespace) -> int:
    """list, add or remove the models a running server serves

    Without arguments, list the models a running server serves. 'models add NAME=FILE' serves
    one more model without a restart: the server checks it, then every worker loads it, one at
    a time (exit 0 once they all serve it). 'models remove NAME' stops serving one: requests for
    it are refused from then on, and every process lets go of its file. Exit 1 with the reason
    when the server refuses.
    """
    if args.action != "list" and not args.model:
        raise CommandError(f"models {args.action} needs the model: "
                           f"{'NAME=FILE' if args.action == 'add' else 'NAME'}", exit_code=2)
    if args.action == "list" and args.model:
        raise CommandError(f"models list takes no model ({args.model!r}): it lists them all", exit_code=2)
    endpoint = control_endpoint(args)
    if args.action == "add":  # the file as this shell names it, not as the server's directory would
        with reported(ModelsError):
            found = list_models([args.model], burnpack.resolve)
        if found.folders or len(found.named) != 1:
            raise CommandError("models add takes one weight file: NAME=FILE or FILE", exit_code=2)
        name, path, _ = found.named[0]
        args.model = f"{name}={os.path.abspath(path)}"
    request = {args.action: args.model} if args.action != "list" else {}
    with reported(control.ControlError, saying=lambda exc: f"models {args.action} failed: {exc}"):
        answer = control.call(endpoint, "models", timeout=args.timeout, **request)
    if args.action == "add":
        print(f"workerpool: every worker now serves {args.model}")
    elif args.action == "remove":
        print(f"workerpool: {args.model} is no longer served")
    else:
        for name, model in answer["models"].items():
            print(f"{name}: {model['path']} (model {model['name']}, generation {model['generation']}, "
                  f"{worker_count(model['workers'])}, max batch {model['max_batch']})")
    return 0


def add_publish(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_publish)
    add_source_and_destination(parser, ("SRC.bpk", "the new weights, checked before anything is replaced"),
                               "the path the server serves")
    add_control(parser, "the running server to ask to check SRC (default: as status)")
    parser.add_argument("--no-check", action="store_true",
                        help="publish SRC even if it does not fit the served model: do not ask the "
                        "running server, nor compare SRC with the model at DEST (SRC itself is "
                        "still checked)")
    add_model(parser, "the model to check SRC against when no server checks it (default: as serve)")


def cmd_publish(args: argparse.Namespace) -> int:
    """deploy new weights: validate, copy beside DEST, rename over it

    Validate SRC, copy it to a temporary file in DEST's directory, fsync it, rename it over DEST
    (the file a link at DEST names) and fsync the directory. A server watching DEST then
    reloads. The running server that serves DEST (--control, else where serve listens by
    default) is asked first whether it would take the copy; with no server there, SRC's model
    must fit the one at DEST. A refused SRC leaves DEST untouched (exit 1).
    """
    from ..weights.publish import PublishError, publish

    checker, served = (None, None) if args.no_check else _checking_server(args)
    with reported(PublishError):
        identity = publish(args.source, args.destination, control_endpoint=checker, model=args.model,
                           fit=not args.no_check, served=served)
    print(f"workerpool: published {args.source} as {args.destination} (inode {identity.inode}, "
          f"{format_size(identity.size)}){'; the server checked it first' if checker else ''}")
    return 0


def _checking_server(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The control endpoint of the running server that serves DEST and the name it serves it
    under; (None, None) (then SRC is checked here) when none does: no server answers by
    default, or it serves other files."""
    endpoint = control_endpoint(args)
    try:
        status = control.call(endpoint, "status", timeout=STATUS_SECONDS, memory=False)
    except control.ControlError as exc:
        if isinstance(exc, control.NoServer) and not args.control:
            print(f"workerpool: no server is running at {endpoint}: checking {args.source} here")
            return None, None
        raise CommandError(f"{args.source}: cannot ask the running server to check it: {exc} "
                           "(--no-check publishes without asking)") from exc
    destination = os.path.realpath(args.destination)
    for name, model in status["models"].items():
        if os.path.realpath(model["path"]) == destination:
            return endpoint, name
    served = ", ".join(model["path"] for model in status["models"].values())
    print(f"workerpool: the server at {endpoint} serves {served}, not {args.destination}: "
          f"checking {args.source} here")
    return None, None
