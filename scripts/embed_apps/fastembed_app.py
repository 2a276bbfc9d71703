"""OpenAI-shaped ``POST /v1/embeddings`` with fastembed in FastAPI, for uvicorn: the folder of a
sentence-transformers model exported to ONNX (``$EMBED_FOLDER``), loaded from its local files.

fastembed knows models by name; a folder of one's own is registered with
``TextEmbedding.add_custom_model`` and loaded with ``specific_model_path`` (never the hub).
Its tokenizer cuts at the smaller of tokenizer_config.json's ``model_max_length`` and
``max_length`` (128 for this export, where sentence-transformers cuts at 256), so the cut is set
again to 256. Mean pooling and normalisation are fastembed's; its cache directory (created even
for a local folder) is ``$EMBED_CACHE``. ``X-Worker-Pid`` names the worker that answered.

    EMBED_FOLDER=minilm-onnx uvicorn --workers 2 --app-dir scripts embed_apps.fastembed_app:app
"""

from __future__ import annotations

import json
import os

from fastapi import FastAPI, Response
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType
from pydantic import BaseModel

FOLDER = os.environ["EMBED_FOLDER"]
NAME = "local/" + os.path.basename(os.path.normpath(FOLDER))
with open(os.path.join(FOLDER, "1_Pooling", "config.json")) as file:
    DIM = json.load(file)["embedding_dimension"]
# sources is required, and never read when specific_model_path is given
TextEmbedding.add_custom_model(NAME, pooling=PoolingType.MEAN, normalization=True, dim=DIM,
                               sources=ModelSource(hf=NAME), model_file="onnx/model.onnx")
EMBEDDER = TextEmbedding(NAME, specific_model_path=FOLDER, cache_dir=os.environ.get("EMBED_CACHE"),
                         local_files_only=True)
EMBEDDER.model.tokenizer.enable_truncation(256)  # type: ignore[attr-defined]  # the loaded model's

app = FastAPI()


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str = NAME


@app.post("/v1/embeddings")
def embeddings(request: EmbeddingRequest) -> Response:
    texts = [request.input] if isinstance(request.input, str) else request.input
    vectors = list(EMBEDDER.embed(texts))
    tokens = EMBEDDER.token_count(texts)
    body = json.dumps({
        "object": "list", "model": request.model,
        "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
    return Response(body, media_type="application/json", headers={"X-Worker-Pid": str(os.getpid())})
