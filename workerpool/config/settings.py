"""Every option of ``serve`` and ``workers``, each declared once.

A :class:`Setting` holds all that is said about one option: its flags, how its text is parsed,
its default, its help and which commands take it. The command line's options, the keys of a
``--config`` file and the ``WORKERPOOL_*`` variables (:mod:`.sources`, from those options), the
defaults of :class:`~workerpool.config.pool.PoolConfig` and its subclasses, and the option
tables of ``docs/configuration.md`` (:mod:`.docs`) are all made from :data:`SETTINGS`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..endpoints import DEFAULT_BIND
from ..linux.cpus import usable_cpus
from ..logs import FORMATS, LEVELS
from ..runtime import default_cache_dir
from ..units import MS_PER_SECOND
from . import values

SERVE, WORKERS = "serve", "workers"
POOL = frozenset({SERVE, WORKERS})
SERVE_ONLY, WORKERS_ONLY = frozenset({SERVE}), frozenset({WORKERS})
CLIENTS = frozenset({WORKERS, "infer", "embed"})  # the commands that connect to a router
MODEL_METAVAR = "NAME|module:factory"
QUEUE_BYTES_CAP = 1 << 30  # queued requests may hold at most this, or 1/8 of the memory


def default_max_queue_bytes() -> int:
    """1 GiB, or an eighth of this machine's memory if that is less."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(QUEUE_BYTES_CAP, memory // 8)




@dataclass(frozen=True)
class Setting:
    """One option: ``flag`` (``--max-batch``, or a bare name for a positional argument) names
    it, and its key (``max_batch``) is argparse's destination, the config field and the file and
    environment key."""

    flag: str
    _: KW_ONLY
    help: str | Mapping[str, str]  # by command where they differ; {placeholders}: see cli.arguments
    commands: frozenset[str] = POOL
    default: Any = None
    default_factory: Callable[[], Any] | None = None  # a default found at run time
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False
    from_files: bool = True  # False: only the command line gives it
    per_model: bool = False  # NAME=VALUE gives it for one model (config.models)
    file_value: Callable[[Any], Any] | None = None  # how --print-config writes it, if not as parsed
    doc: str = ""  # its meaning in docs/configuration.md
    doc_default: str | None = None  # the default there, when the value alone does not say it

    @property
    def name(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def positional(self) -> bool:
        return not self.flag.startswith("-")

    def help_for(self, command: str) -> str:
        return self.help if isinstance(self.help, str) else self.help[command]

    def initial(self) -> Any:
        """The default, found now if it depends on the machine."""
        return self.default_factory() if self.default_factory else self.default


LOAD_MODE_HELP = {
    "mmap": "share one mapped copy of the weights",
    "copy": "a private copy per worker, the naive baseline",
}


def _modes_help(modes: Mapping[str, str], default: str) -> str:
    """``--load``'s help, marking whichever mode is the default."""
    return "; ".join(f"{mode}: {text}" + (" (default)" if mode == default else "")
                     for mode, text in modes.items())


def _for(commands: frozenset[str], *settings: Setting) -> tuple[Setting, ...]:
    """``settings``, each taken by ``commands`` alone: a group's commands are said once."""
    return tuple(dataclasses.replace(setting, commands=commands) for setting in settings)


_POOL_SETTINGS = (
    Setting("models", metavar="MODEL",
            help={SERVE: "the models to serve, each a Burnpack weight file (served under its name "
                  "without .bpk), NAME=FILE to name it, or a folder: every .bpk in it, read again on "
                  "SIGHUP (the config file's 'models' key, or WORKERPOOL_MODELS, gives them otherwise)",
                  WORKERS: "this host's copies of the weights, named as serve names them"}),
    Setting("--config", metavar="FILE", from_files=False,
            help="read options from this TOML file (keys are the long option names: workers = 8, "
            "max-batch = 16); the environment's WORKERPOOL_<OPTION> variables come next, the command "
            "line wins over both",
            doc="read options from a TOML file; `WORKERPOOL_<OPTION>` environment variables come next, "
            "the command line wins (see [below](#configuration-files-and-environment-variables))"),
    Setting("--print-config", switch=True, from_files=False,
            help="print the options in effect, as a --config file, and exit",
            doc="print the options in effect as a `--config` file and exit"),
    Setting("--log-format", choices=FORMATS, default="text",
            help="text, or json: one JSON object per line (default: %(default)s)",
            doc="`json`: one JSON object per line (see [Logs](operations.md#logs))"),
    Setting("--workers", parse=values.count, default_factory=usable_cpus, per_model=True,
            help="worker processes (default: the CPUs this process may use, by its affinity and its "
            "cgroup's CPU quota, {default} here); NAME=N: only N of them map and serve the model NAME "
            "(default: every worker serves every model)",
            doc="worker processes; `NAME=N`: only N of them map and serve the model NAME (see "
            "[Several models](models.md#several-models-in-one-pool))",
            doc_default="the CPUs the process may use (its affinity, and a container's CPU quota); every "
            "worker serves every model"),
    Setting("--model", metavar=MODEL_METAVAR, per_model=True,
            help="model to build (default: metadata workerpool.model, else recognised from the "
            "tensors; built-ins: {builtin_models}); NAME=SPEC for one model",
            doc="the model to build on the weights (built-ins: `mlp`, `burn-mnist`, `bert`); "
            "`NAME=SPEC` for one model",
            doc_default="see [Models](models.md#choosing-the-model)"),
    Setting("--load", choices=tuple(LOAD_MODE_HELP), default="mmap",
            help=_modes_help(LOAD_MODE_HELP, "mmap"),
            doc="`mmap` shares one mapped copy of the weights; `copy` gives each worker a private copy "
            "(the naive baseline)"),
    Setting("--graceful-timeout", parse=values.seconds, default=30.0, metavar="S",
            help={SERVE: "on SIGTERM, seconds to finish in-flight requests (default: %(default)s)",
                  WORKERS: "on SIGTERM, seconds for workers to leave the router (default: %(default)s)"},
            doc="on SIGTERM/SIGINT, how long in-flight and queued requests may take to finish"),
    Setting("--watch-interval", parse=values.positive_seconds, default=0.5, metavar="S",
            help="seconds between checks of MODEL.bpk for new weights published by rename "
            "(default: %(default)s)",
            doc="how often to check MODEL.bpk for new weights (see [Deploying new "
            "weights](operations.md#deploying-new-weights))"),
    Setting("--start", choices=("fork", "spawn"), default="fork",
            help="fork: fork each worker from a warm template process that has imported everything "
            "(a worker costs a few MiB); spawn: start each worker as a fresh interpreter, for models or "
            "libraries that are not safe to fork (default: %(default)s)",
            doc="`fork`: each worker is forked from a warm template process that has already imported "
            "everything (a worker costs a few MiB, [measured](benchmarks.md#memory), and is ready in "
            "milliseconds); `spawn`: each worker is a fresh interpreter (about four times the memory, "
            "and it starts in a second or two). See [Fork or "
            "spawn](benchmarks.md#fork-or-spawn)"),
    Setting("--threads-per-worker", parse=values.positive_count, metavar="N",
            help="threads for each worker's numpy BLAS and OpenMP pools and onnxruntime session "
            "(default: the CPUs this process may use divided by --workers, at least 1)",
            doc="threads for each worker's numpy BLAS and OpenMP pools (set with threadpoolctl) and its "
            "onnxruntime session's intra-op pool; shown in `status` and the start-up log. See [The CPU "
            "budget](benchmarks.md#the-cpu-budget)",
            doc_default="CPUs available ÷ `--workers` (at least 1)"),
    Setting("--max-worker-memory", parse=values.positive_size, metavar="SIZE",
            help="recycle a worker whose private memory passes SIZE, after it answers; an allocation "
            "past it fails that request with 'internal' (default: no limit)",
            doc="a worker's private memory bound: an allocation past it fails that request "
            "(`internal`), and a worker left above it is replaced after answering"),
    Setting("--cache-dir", parse=values.cache_dir, default_factory=default_cache_dir, metavar="DIR",
            file_value=lambda folder: values.CACHE_OFF if folder is None else folder,
            help="where models keep what they prepare once per machine and weight file (an ONNX "
            "model's prepacked weights); 'off' prepares nothing (default: %(default)s)",
            doc="where models keep what they prepare once per machine and weight file: an ONNX "
            "model's prepacked weights, shared by every worker (see [ONNX models](models.md#onnx-models)); "
            "`off` prepares nothing",
            doc_default="`$XDG_CACHE_HOME/workerpool`, else `~/.cache/workerpool`"),
    Setting("--no-watch", switch=True,
            help="do not watch MODEL.bpk; reload only on SIGHUP (or 'workerpool reload')",
            doc="reload only on `SIGHUP` or `workerpool reload`"),
    Setting("--log-level", choices=LEVELS, default="info", help="default: %(default)s",
            doc="how much the logs say"),
)

_SERVE_SETTINGS = _for(SERVE_ONLY,
    Setting("--bind", parse=values.bind_endpoint, default=DEFAULT_BIND,
            metavar="ENDPOINT", help="client endpoint (default: %(default)s, loopback only; "
            "tcp://127.0.0.1:* picks a free port, named in the ready line)",
            doc="where clients connect; loopback unless you say otherwise (`tcp://127.0.0.1:*` picks "
            "a free port, shown in the ready line)"),
    Setting("--control", parse=values.control_endpoint, metavar="ENDPOINT",
            help="control endpoint for status (default: an ipc socket in a private runtime directory)",
            doc="where `status` asks: an `ipc://` path in a directory of yours with mode 0700 "
            "(anything else is refused at start); the socket is created mode 0600",
            doc_default="`ipc://$XDG_RUNTIME_DIR/workerpool/control.sock` (or "
            "`/tmp/workerpool-<uid>/`, mode 0700)"),
    Setting("--max-queue", parse=values.count, default=1024, metavar="N",
            help="requests that may wait for a free worker; more are refused with 'overloaded' "
            "(default: %(default)s)",
            doc="requests that may wait for a free worker; beyond that a request is answered "
            "`overloaded` at once (see [Security and reliability](security.md) for how the queue is "
            "shared)"),
    Setting("--max-message-size", parse=values.positive_size, metavar="SIZE",
            help="largest request accepted, at least 1MiB (default: room for a batch of 4096 of the "
            "model's inputs, at least 1MiB; 64MiB when the model declares no input shape)",
            doc="the largest request accepted, at least 1MiB; clients learn it and refuse larger "
            "requests (`RequestTooLarge`, HTTP 413)",
            doc_default="room for 4096 inputs of the model, at least 1MiB (64MiB if the model declares "
            "no input shape)"),
    Setting("--max-queue-bytes", parse=values.positive_size,
            default_factory=default_max_queue_bytes, metavar="SIZE",
            help="bytes that waiting requests may hold together; past it new ones are refused with "
            "'overloaded' (default: 1GiB or 1/8 of memory, here {default_size})",
            doc="the bytes waiting requests may hold together; beyond that, `overloaded`",
            doc_default="1GiB, or 1/8 of memory if less"),
    # 20 s: below the clients' default 30 s timeout, so a stuck request is answered before a
    # client resends it to a second worker.
    Setting("--request-timeout", parse=values.positive_seconds, default=20.0,
            metavar="S",
            help="seconds a request may run on a worker; past it the client gets 'request_timeout' and "
            "the worker is replaced. Keep it below your clients' timeout (default: %(default)s)",
            doc="how long a request may run on a worker; past it the client gets `request_timeout` and "
            "the worker is replaced. Keep it below your clients' timeout (30 s by default)"),
    Setting("--max-batch", parse=values.positive_count, default=32, per_model=True,
            metavar="ROWS",
            help="rows (or texts) one forward pass may take, from one request or several waiting "
            "ones: a longer request is cut into parts that free workers run side by side (a KServe "
            "body runs on one worker, in passes); 1: one row a pass, no request shares one; "
            "NAME=ROWS for one model (default: {default})",
            doc="rows (or texts) one forward pass may take, from one request or several waiting ones; "
            "a request with more is cut into parts that free workers run side by side (a KServe body "
            "runs on one worker, in passes); `1`: one row a pass, no request shares one; `NAME=ROWS` "
            "for one model (see [Batching](benchmarks.md#batching))"),
    Setting("--truncate", switch=True,
            help="cut texts over a model's token limit instead of refusing them (a request may "
            "ask either way: TEI's 'truncate'); OpenAI and TEI refuse them by default too",
            doc="cut texts over a model's token limit (its `max_input_tokens`, in `info`) to the "
            "limit, as sentence-transformers does, instead of refusing the request (`400`, TEI's "
            "`413`); a TEI request's `truncate` decides for itself"),
    Setting("--batch-wait", parse=values.milliseconds, default=0.0, per_model=True,
            metavar="MS", file_value=lambda seconds: seconds * MS_PER_SECOND,
            help="milliseconds a request may wait for others to share its forward pass when fewer "
            "than --max-batch rows are queued; NAME=MS for one model (default: 0, never wait)",
            doc="how long a request may wait for others to share its forward pass while fewer than "
            "`--max-batch` requests wait; 0 never delays a request; `NAME=MS` for one model"),
    Setting("--pass-budget", parse=values.milliseconds, default=0.025, per_model=True,
            metavar="MS", file_value=lambda seconds: seconds * MS_PER_SECOND,
            help="milliseconds of work one message to a worker may hold for a model of texts: "
            "waiting texts stop joining a pass once the model's measured time per text says the "
            "pass would run longer, so a request waits less behind passes it is not in; 0: only "
            "--max-batch bounds a pass; NAME=MS for one model (default: 25)",
            doc="how long one message to a worker may run, for a model of texts: waiting texts stop "
            "joining it once the model's measured time per text says it would run longer (at least "
            "one request goes), so a request waits less behind passes it is not in; `0`: only "
            "`--max-batch` bounds it; `NAME=MS` for one model (see [Batching](benchmarks.md#batching))"),
    Setting("--access-log-sample", parse=values.fraction, default=1.0, metavar="FRACTION",
            help="the share of requests answered well that get an access line, counted, not drawn "
            "(0.01: every hundredth); errors always get one; 0: errors alone (default: %(default)s, every one)",
            doc="the share of the requests answered well that get an [access line](operations.md#access-log), "
            "counted, not drawn (`0.01`: every hundredth); requests answered with an error (4xx, 5xx, an "
            "error code) always get one; `0`: errors alone"),
    Setting("--no-access-log", switch=True, default=False,
            help="write no access line at all, errors included (default: one line per answered request)",
            doc="write no [access line](operations.md#access-log), errors included"),
    Setting("--max-connections", parse=values.positive_count, metavar="N",
            help="client connections served at once, each from its first request on; requests on "
            "more are answered overloaded until one closes (default: 7/8 of what the open file "
            "limit leaves room for, halved with --http, which has as many of its own)",
            doc="client connections served at once, each counted from its first request until it "
            "closes; requests on further connections are answered `overloaded` until a place frees, "
            "and connections past what the open file limit leaves room for are closed as they arrive",
            doc_default="7/8 of the connections the open file limit leaves room for, halved with "
            "`--http` (HTTP connections have as many)"),
    Setting("--http", metavar="HOST:PORT",
            help="serve HTTP here: KServe v2 inference (/v2/...), OpenAI embeddings (/v1/embeddings), "
            "/metrics, /healthz and /readyz; a bare :PORT is loopback (default: off; needs "
            "workerpool-mmap[http])",
            doc="serve HTTP here (`:PORT` alone is loopback): the [KServe v2 and OpenAI routes](http.md) "
            "and [`/metrics`, `/healthz`, `/readyz`](operations.md#health-readiness-and-metrics)",
            doc_default="off"),
    Setting("--model-name", metavar="NAME",
            help="the name of the one model served, in requests, HTTP URLs and OpenAI's 'model' "
            "(default: the weight file's name without .bpk; with several models, NAME=FILE names each)",
            doc="the name of the one model served, in `/v2/models/NAME` and OpenAI's `model` (with "
            "several models, `NAME=FILE` names each)", doc_default="the file's name"),
    Setting("--http-timeout", parse=values.seconds, default=10.0, metavar="SECONDS",
            help="how long an HTTP client may take to send a request's head, stay idle between "
            "requests or pause within a body before it is closed (default: %(default)s)",
            doc="how long an HTTP client may take to send a request's head, stay idle between requests "
            "or pause within a body before its connection is closed"),
    Setting("--http-token-file", metavar="FILE",
            help="require 'Authorization: Bearer TOKEN' on every HTTP route but the probes and /metrics; "
            "the token is this file's content (default: none)",
            doc="a file holding the bearer token every HTTP route but the probes and `/metrics` needs"),
    Setting("--http-cert", metavar="FILE",
            help="serve HTTPS with this certificate chain (PEM), with --http-key (default: plain HTTP)",
            doc="HTTPS: the certificate chain, PEM (with `--http-key`)"),
    Setting("--http-key", metavar="FILE",
            help="the private key of --http-cert (PEM)", doc="HTTPS: the private key, PEM"),
    Setting("--backend", parse=values.bind_endpoint, metavar="ENDPOINT",
            help="a TCP endpoint such as tcp://0.0.0.0:5556 where 'workerpool workers' on other hosts "
            "join (default: none; local workers always have a socket pair of their own)",
            doc="a TCP endpoint where worker hosts join (see [Scaling out](operations.md#scaling-out)); "
            "local workers always have a socket pair of their own"),
    # One flag per meaning: --curve-server-key is the server's public key, on clients and hosts.
    Setting("--curve-secret-key", metavar="FILE",
            help="this server's secret key file (from 'workerpool keys generate'): authenticate and "
            "encrypt the client and TCP worker endpoints with CURVE",
            doc="this server's secret key file: CURVE authentication and encryption of the client and "
            "TCP worker endpoints (see [Scaling out](operations.md#scaling-out))"),
    Setting("--curve-client-keys", metavar="DIR",
            help="directory of the public key files of allowed clients",
            doc="the directory of the public key files of the clients allowed"),
    Setting("--curve-worker-keys", metavar="DIR",
            help="directory of the public key files of allowed worker hosts (needed for a --backend on "
            "TCP; a client key never admits a worker host)",
            doc="the directory of the public key files of the worker hosts allowed, a list apart from "
            "the clients'; required with a TCP `--backend`"),
)

_CLIENT_SETTINGS = (
    Setting("--connect", commands=WORKERS_ONLY, parse=values.endpoint, metavar="ENDPOINT",
            help="the router's backend endpoint, e.g. tcp://router-host:5556 (required)",
            doc="the router's backend endpoint, e.g. `tcp://router-host:5556` (required; or "
            "`WORKERPOOL_CONNECT`)"),
    Setting("--curve-key", commands=CLIENTS, metavar="FILE",
            help="this side's secret key file, for a server using CURVE",
            doc="this host's secret key file, for a router using CURVE"),
    Setting("--curve-server-key", commands=CLIENTS, metavar="FILE",
            help="the server's public key file (NAME.key)",
            doc="the router's public key file (`NAME.key`)"),
)

SETTINGS: tuple[Setting, ...] = _POOL_SETTINGS + _SERVE_SETTINGS + _CLIENT_SETTINGS
"""In the order of ``--help``: ``serve``'s and ``workers``' shared options first."""
_BY_NAME = {setting.name: setting for setting in SETTINGS}


def of_command(command: str) -> tuple[Setting, ...]:
    return tuple(setting for setting in SETTINGS if command in setting.commands)


def setting(name: str) -> Setting:
    return _BY_NAME[name]


def field(name: str) -> Any:
    """A config dataclass field whose default is the setting ``name``'s."""
    found = _BY_NAME[name]
    if found.default_factory is not None:
        return dataclasses.field(default_factory=found.default_factory)
    return dataclasses.field(default=found.default)
