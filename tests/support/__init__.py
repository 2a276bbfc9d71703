"""What the tests share, by topic: starting servers (``server``), the command line (``commands``),
raw sockets and frames (``sockets``), status predicates (``status``), background calls and
processes (``processes``), CURVE keys (``keys``), reference models (``models``), small ONNX
graphs and text models (``onnx_graphs``, ``onnx_texts``), hand-built
Burnpack bytes (``bpk_builder``), the Kubernetes manifests checked offline
(``manifests``), a checked load of KServe requests through a load balancer (``kserve_load``)
and where things are (``paths``)."""
