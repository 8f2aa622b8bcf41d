"""An OpenAI-compatible chat endpoint on 127.0.0.1 that answers with the project's tiny model.

``python tests/chat_endpoint.py`` prints ``serving MODEL at http://127.0.0.1:PORT/v1`` and answers
``POST /v1/chat/completions`` (non-streaming: ``messages``, ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``n``, ``seed``) and ``GET /v1/models`` (``stream: true``: server-sent chunks) with real
generations of the tiny Qwen2 model (``bpo_algos.policy.tiny``, built offline), so a harness that
calls an OpenAI client (verifiers' rollouts) runs with no network. Sampling is seeded per
request. Runs in the main venv (torch, transformers, fastapi, uvicorn); the harness may live in
another venv and reach it over HTTP.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer

from bpo_algos.policy.tiny import tiny_model_path

MODEL_NAME = "bpo-tiny"


def create_app(path: str | None = None) -> FastAPI:
    path = path or str(tiny_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    lock = threading.Lock()  # one generation at a time (CPU)
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "bpo-gym"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> Any:
        messages = [{"role": m["role"], "content": _text(m.get("content"))} for m in body["messages"]]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 24)
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        choices, completion = [], 0
        with lock, torch.no_grad():
            torch.manual_seed(int(body.get("seed") or 0))
            for i in range(int(body.get("n") or 1)):
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=min(max_new, 64),
                    do_sample=temperature > 0, temperature=max(temperature, 1e-3), top_k=0, top_p=1.0,
                )
                new = out[0, ids.shape[1]:]
                completion += len(new)
                finished = bool(len(new)) and int(new[-1]) == model.generation_config.eos_token_id
                text = tokenizer.decode(new, skip_special_tokens=True)
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop" if finished else "length", "logprobs": None})
        reply = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", MODEL_NAME), "choices": choices,
            "usage": {"prompt_tokens": int(ids.shape[1]), "completion_tokens": completion,
                      "total_tokens": int(ids.shape[1]) + completion},
        }
        return StreamingResponse(_chunks(reply), media_type="text/event-stream") if body.get("stream") else reply

    return app


def _chunks(reply: dict[str, Any]) -> Iterator[str]:
    """The reply as OpenAI's server-sent ``chat.completion.chunk`` events (one content delta
    per choice, its finish reason, the usage, ``[DONE]``)."""
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    for c in reply["choices"]:
        delta = {"role": "assistant", "content": c["message"]["content"]}
        yield f"data: {json.dumps(head | {'choices': [{'index': c['index'], 'delta': delta, 'finish_reason': None}]})}\n\n"
        yield f"data: {json.dumps(head | {'choices': [{'index': c['index'], 'delta': {}, 'finish_reason': c['finish_reason']}]})}\n\n"
    yield f"data: {json.dumps(head | {'choices': [], 'usage': reply['usage']})}\n\n"
    yield "data: [DONE]\n\n"


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def main() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app()
    print(f"serving {MODEL_NAME} at http://127.0.0.1:{port}/v1", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
