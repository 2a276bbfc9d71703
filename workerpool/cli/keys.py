"""``keys generate``: CURVE key pairs for servers, clients and worker hosts."""

from __future__ import annotations

import argparse

from .. import security
from .failures import reported
from .parser import Subcommands, add_command, add_group

KEYS_HELP = """generate CURVE key pairs

'workerpool keys generate DIR [--name NAME]' writes DIR/NAME.key (public) and DIR/NAME.key_secret
(secret, mode 0600)."""


def add_keys(sub: Subcommands) -> None:
    keys = add_group(sub, "keys", KEYS_HELP)
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    generate = add_command(actions, cmd_generate)
    generate.add_argument("directory", metavar="DIR", help="where to write the key files")
    generate.add_argument("--name", default="workerpool", help="file name stem (default: %(default)s)")


def cmd_generate(args: argparse.Namespace) -> int:
    """write a new key pair

    Write DIR/NAME.key (the public key, to hand to the other side) and DIR/NAME.key_secret (mode
    0600, to keep). DIR is created if needed.
    """
    with reported(OSError, saying=lambda exc: f"{args.directory}: cannot write keys: {exc.strerror or exc}"):
        public, secret = security.generate(args.directory, args.name)
    print(f"workerpool: wrote {public} (public: give it to the other side) and {secret} "
          "(secret: keep it here, mode 0600)")
    return 0
