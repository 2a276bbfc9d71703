"""How an ONNX model sits in a Burnpack file, shared by ``convert`` (which writes it) and the
built-in ``onnx`` model (which serves it).

Every initializer of the graph is a tensor of the file under its ONNX name, aligned as every
Burnpack tensor is, so that a worker hands onnxruntime a view of the shared mapping instead of
a copy. The graph itself, without its weights, is the ``uint8`` tensor :data:`GRAPH_TENSOR`:
each initializer there keeps its name, dtype and shape but its data is an external-data entry
naming :data:`PLACEHOLDER` (offset 0, the tensor's length). onnxruntime checks that such a file
exists before it takes the initializers a session is given instead
(``SessionOptions.add_initializer``), so the package ships an empty file of that name in this
folder (:data:`PLACEHOLDER_FOLDER`) and sessions look for external data there; should an
initializer ever go unsupplied, reading the empty file fails loudly instead of reading other
bytes. Integer initializers of at most :data:`INLINE_BYTES` (shapes, axes, indices) also keep their
data in the graph: onnxruntime's shape inference reads their values while it loads the graph,
before any supplied initializer is looked at. What the graph declares of each initializer is
:data:`INITIALIZERS_KEY` (JSON: name to ``[dtype, shape]``, the dtype as numpy writes it), so
that a worker refuses a file whose tensors do not fit its graph (onnxruntime would take them and
fail every request) without parsing the graph. Which inputs index an embedding table directly
(a ``Gather`` on an initializer fed by a graph input) is :data:`LOOKUPS_KEY` (JSON: input name
to ``[table, axis]``), so that a worker checks token ids without parsing the graph. A tokenizer
travels as ``bert``'s does; how token states become one embedding, as :data:`POOLING_KEY`
(JSON: ``{"mode": "mean"|"cls"|"max", "normalize": bool}``).
"""

from __future__ import annotations

import os

NAME = "onnx"  # the built-in model, named in the file's metadata workerpool.model
GRAPH_TENSOR = "workerpool.onnx.graph"
POOLING_KEY = "workerpool.pooling"
LOOKUPS_KEY = "workerpool.onnx.lookups"
INITIALIZERS_KEY = "workerpool.onnx.initializers"
INLINE_BYTES = 4096
PLACEHOLDER = "onnx-initializer-placeholder"
PLACEHOLDER_FOLDER = os.path.dirname(os.path.abspath(__file__))
