"""The Mosec side of ``scripts/http_bench.py``: the Burnpack model at ``$COMPARE_MODEL`` behind
Mosec's Rust HTTP front, as its documentation has a user write it: a ``Worker`` whose
``forward`` takes a batch (dynamic batching up to ``$COMPARE_MAX_BATCH``), raw float32 rows in
and raw bytes out (``deserialize``/``serialize`` overridden), ``$COMPARE_WORKERS`` processes.

    COMPARE_MODEL=model.bpk COMPARE_WORKERS=2 python3 scripts/compare_app/mosec_app.py --port 8000
    # POST /inference with one or more rows of float32
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from mosec import Server, Worker
from mosec.errors import ValidationError


class Inference(Worker):
    def __init__(self) -> None:
        super().__init__()
        from threadpoolctl import threadpool_limits

        from workerpool import burnpack, models

        threadpool_limits(limits=int(os.environ.get("COMPARE_THREADS", "1")))
        pack = burnpack.read(os.environ["COMPARE_MODEL"])
        self.model = models.build_model(pack.tensors, pack.metadata)
        self.width = int(models.Contract.of(self.model, "mlp").info()["inputs"][0]["shape"][-1])

    def deserialize(self, data: bytes) -> Any:
        if not data or len(data) % (4 * self.width):
            raise ValidationError(f"expected rows of {self.width} float32")
        return np.frombuffer(data, dtype=np.float32).reshape(-1, self.width)

    def serialize(self, data: Any) -> bytes:
        return np.ascontiguousarray(data, dtype=np.float32).tobytes()

    def forward(self, data: list[np.ndarray]) -> list[np.ndarray]:
        counts = [len(rows) for rows in data]
        outputs = self.model(np.concatenate(data)) if len(data) > 1 else self.model(data[0])
        return np.split(np.asarray(outputs), np.cumsum(counts)[:-1])


if __name__ == "__main__":
    server = Server()
    server.append_worker(Inference, num=int(os.environ.get("COMPARE_WORKERS", "2")),
                         max_batch_size=int(os.environ.get("COMPARE_MAX_BATCH", "16")), max_wait_time=10)
    server.run()
