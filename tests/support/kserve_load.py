"""A load of KServe requests through a load balancer (``benchlib.balancers`` runs nginx and
HAProxy from the configurations deploy/ ships), whose every answer is checked."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np


@dataclass
class Load:
    """``connections`` clients sending KServe requests through ``port`` until stopped, of
    ``rows`` rows in turn (8 rows of a 256-wide model: a JSON body of about 41 KiB, past the
    16 KiB a proxy keeps in memory by default); each answer must be 200 and equal
    ``expected[model_version](x)``."""

    port: int
    model: str
    width: int
    expected: dict[str, Callable[[np.ndarray], np.ndarray]]
    connections: int = 16
    rows: tuple[int, ...] = (1, 8)
    answers: dict[str, int] = field(default_factory=dict)  # by model_version
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _counted: threading.Condition = field(default_factory=threading.Condition)  # each answer notifies
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Self:
        for seed in range(self.connections):
            thread = threading.Thread(target=self._client, args=(seed,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    @property
    def answered(self) -> int:
        with self._counted:
            return sum(self.answers.values())

    def await_answers(self, more: int, timeout: float = 60.0) -> None:
        """Until ``more`` answers have come since now (requests flow through the balancer)."""
        with self._counted:
            target = sum(self.answers.values()) + more
            met = self._counted.wait_for(lambda: sum(self.answers.values()) >= target, timeout)
            assert met, f"only {sum(self.answers.values())} answers; failures: {self.failures[:5]}"

    def _client(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        path = f"/v2/models/{self.model}/infer"
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        turn = seed
        while not self._stop.is_set():
            rows = self.rows[turn % len(self.rows)]
            turn += 1
            x = rng.standard_normal((rows, self.width)).astype(np.float32)
            body = json.dumps({"inputs": [{"name": "input", "shape": [rows, self.width], "datatype": "FP32",
                                           "data": x.ravel().tolist()}]})
            try:
                connection.request("POST", path, body, {"Content-Type": "application/json"})
                reply = connection.getresponse()
                outcome = self._check(reply.status, reply.read(), x)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                outcome = f"{type(exc).__name__}: {exc}"
            with self._counted:
                if isinstance(outcome, str):
                    self.failures.append(outcome)
                else:
                    self.answers[outcome[0]] = self.answers.get(outcome[0], 0) + 1
                    self._counted.notify_all()
        connection.close()

    def _check(self, status: int, body: bytes, x: np.ndarray) -> tuple[str] | str:
        if status != 200:
            return f"{status}: {body[:200]!r}"
        document: dict[str, Any] = json.loads(body)
        version = document["model_version"]
        if version not in self.expected:
            return f"answered by unknown generation {version}"
        output = np.asarray(document["outputs"][0]["data"], np.float32)
        if not np.allclose(output, self.expected[version](x).ravel(), rtol=1e-4, atol=1e-5):
            return f"a wrong answer for generation {version}"
        return (version,)
