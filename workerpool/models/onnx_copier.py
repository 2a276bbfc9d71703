"""The child that makes this machine's prepacked copy of an ONNX model (see :mod:`.onnx_prepared`):
``python -m workerpool.models.onnx_copier FILE.bpk FOLDER IDENTITY``.

It points each placeholder of the graph at the weight file itself (its folder, its name, the
tensor's offset in it), which needs the onnx package, and builds a session that saves the
optimised model with its prepacked weights into FOLDER; then checks that the file is still the
one it was asked for (IDENTITY, JSON). A failure is one line on stderr and exit code 1.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from .. import burnpack, extras
from .onnx_layout import GRAPH_TENSOR, PLACEHOLDER

MODEL_FILE, DATA_FILE = "model.onnx", "model.data"
SMALLEST_EXTERNAL = 1024  # bytes: smaller initializers stay inside model.onnx


class NotPrepared(Exception):
    """The copy could not be made; the message says why, in one line."""


def make_copy(path: str, folder: str, identity: list[int]) -> None:
    """In the child: write ``folder``/model.onnx and model.data for the weight file ``path``."""
    try:
        import onnx
    except ImportError:
        raise NotPrepared(extras.missing("onnx", "a prepacked copy")) from None
    import onnxruntime as ort

    pack = burnpack.read(path, mmap=True)
    if pack.identity.as_list() != identity:
        raise NotPrepared(f"{path} was replaced before its copy was made")
    real = os.path.realpath(path)  # onnxruntime refuses external data outside its folder
    graph = onnx.load_from_string(pack.tensors[GRAPH_TENSOR].tobytes())
    for initializer in graph.graph.initializer:
        entries = {entry.key: entry for entry in initializer.external_data}
        if "location" in entries and entries["location"].value == PLACEHOLDER:
            entries["location"].value = os.path.basename(real)
            entries["offset"].value = str(pack.infos[initializer.name].offset)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = os.path.join(folder, MODEL_FILE)
    for key, value in (("session.model_external_initializers_file_folder_path", os.path.dirname(real)),
                       ("session.optimized_model_external_initializers_file_name", DATA_FILE),
                       ("session.optimized_model_external_initializers_min_size_in_bytes", str(SMALLEST_EXTERNAL)),
                       ("session.save_external_prepacked_constant_initializers", "1")):
        options.add_session_config_entry(key, value)
    options.log_severity_level = 3  # errors only: the optimiser's hardware warning is expected
    ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    if burnpack.FileIdentity.of(os.stat(path)).as_list() != identity:
        raise NotPrepared(f"{path} was replaced while its copy was made")


def main(argv: Sequence[str] | None = None) -> int:
    path, folder, identity = argv if argv is not None else sys.argv[1:]
    try:
        make_copy(path, folder, json.loads(identity))
    except Exception as exc:  # noqa: BLE001 - the parent reports the last line and carries on
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
