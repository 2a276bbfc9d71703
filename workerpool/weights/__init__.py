"""The weight files' life: ``convert`` writes them (``onnx_convert`` for an ONNX model,
``sources`` what every converter shares), ``publish`` deploys them, ``reload`` tells when the
served file changed and whether a new one may be served; ``npy`` reads array headers.
"""
