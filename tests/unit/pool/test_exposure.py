"""Which doors a pool's settings leave open to the network, decided from the settings alone
(nothing is bound: a test must not open a port to the network)."""

from __future__ import annotations

import pytest

from workerpool.config.models import ModelEntry
from workerpool.config.pool import ServeConfig
from workerpool.pool.exposure import open_doors
from workerpool.security import ServerKeys


def config(**settings: object) -> ServeConfig:
    return ServeConfig(models=[ModelEntry("model", "model.bpk")], workers=1, **settings)


@pytest.mark.parametrize("settings", [
    {},
    {"http": "127.0.0.1:8000"},
    {"http": ":8000"},  # loopback
    {"http": "localhost:8000"},
    {"http": "[::1]:8000"},
    {"bind": "ipc:///run/pool.sock", "http": "0.0.0.0:8000", "http_token_file": "token"},
])
def test_loopback_and_guarded_doors_say_nothing(settings):
    assert open_doors(config(**settings)) == []


def test_an_http_port_open_to_all_without_a_token_is_named_with_what_to_add():
    warnings = open_doors(config(http="0.0.0.0:8000"))
    assert warnings == [("--http 0.0.0.0:8000 is open to the network without a token: anyone who can "
                         "reach it can run the model (see --http-token-file, and --http-cert so that the "
                         "token is not sent in clear)")]
    assert open_doors(config(http="[::]:8000", http_cert="cert.pem", http_key="key.pem")) == [
        ("--http [::]:8000 is open to the network without a token: anyone who can reach it can run "
         "the model (see --http-token-file)")]


def test_zeromq_doors_without_keys_name_the_servers_own_flags():
    warnings = open_doors(config(bind="tcp://0.0.0.0:5555", backend="tcp://127.0.0.1:5556",
                                 http="0.0.0.0:8000"))
    assert warnings[0] == ("tcp://0.0.0.0:5555 is open to the network without CURVE keys: anyone who "
                           "can reach it can use it (see --curve-secret-key and --curve-client-keys)")
    assert warnings[1].startswith("worker hosts join tcp://127.0.0.1:5556 without CURVE keys")
    assert warnings[2].startswith("--http 0.0.0.0:8000 is open to the network without a token")
    assert "--curve-server-key" not in " ".join(warnings)  # the client's flag for the server's public key


def test_keys_close_the_zeromq_doors(tmp_path):
    keys = ServerKeys(str(tmp_path / "server.key_secret"), str(tmp_path / "clients"))
    assert open_doors(config(bind="tcp://0.0.0.0:5555", server_keys=keys)) == []
