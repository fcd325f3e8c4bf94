# SPDX-License-Identifier: Apache-2.0
"""A judge's own server as a user deploys one, on other nodes: here an OpenAI-compatible HTTP hop in front of the
suite's shared engine, which refuses some judge requests on purpose (faults the real engine cannot be made to
produce). Everything else is forwarded as it came, and the engine's answer comes back as it went.

- It serves under `model` (the engine's own model name is put in the forwarded body) and takes only `api_key`
  (`Authorization: Bearer ...`; anything else is HTTP 401), as a judge deployment with a key of its own does.
- A chat request whose body holds `FAIL_JUDGE_ONCE` is refused (HTTP 400, which NeMo Gym's model server does not
  retry) the first time, and forwarded every later time: a transient fault that the plugin's retry recovers.
- `FAIL_JUDGE_FIRST_OF_<k>`: the first k such requests wait for each other (up to 120 s); the first of them is
  refused, and so is every one after the k-th (the first sample's retries): a fault persistent for one sample of a
  prompt while its k - 1 siblings are judged. Which request is refused never depends on timing.
- `FAIL_JUDGE_CONTEXT`: refused as vLLM refuses a request longer than the model's context (HTTP 400, vLLM's own
  message), every time.

`requests` counts the chat requests per marker (`None` for the others). A context manager; on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ONCE = "FAIL_JUDGE_ONCE"
FIRST_OF = re.compile(r"FAIL_JUDGE_FIRST_OF_(\d+)")
CONTEXT = "FAIL_JUDGE_CONTEXT"
# vLLM 0.24's answer to a request whose prompt and max_tokens exceed the model's context (`vllm/renderers/params.py`).
CONTEXT_ERROR = (
    "This model's maximum context length is 8192 tokens. However, you requested 131072 output tokens and your prompt "
    "contains at least 1 input tokens, for a total of at least 131073 tokens. Please reduce the length of the input "
    "prompt or the number of requested output tokens. (parameter=max_tokens, value=131072)"
)


class FlakyJudgeProxy:
    def __init__(self, engine_url: str, engine_model: str, *, model: str = "judge", api_key: str = "judge-key"):
        self.engine_url = engine_url.rstrip("/")  # the engine's OpenAI base URL, ending in /v1
        self.engine_model, self.model, self.api_key = engine_model, model, api_key
        self.requests: Counter[str | None] = Counter()
        self.refused: Counter[str | None] = Counter()
        self._lock = threading.Lock()
        self._arrived: dict[str, threading.Event] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": proxy.model, "object": "model"}]})
                if self.path == "/health":
                    return self._send(200, {})
                self._send(404, {"error": {"message": f"no GET {self.path}"}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Authorization") != f"Bearer {proxy.api_key}":
                    return self._send(401, {"error": {"message": "invalid api key", "code": "invalid_api_key"}})
                status, payload = proxy.answer(self.path, raw)
                self._send(status, payload)

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FlakyJudgeProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for event in self._arrived.values():
            event.set()
        self.server.shutdown()
        self.server.server_close()

    def _refuses(self, text: str) -> tuple[str | None, bool]:
        """(the request's marker, whether it is refused), counting it."""
        found = FIRST_OF.search(text)
        marker = found.group(0) if found else next((m for m in (ONCE, CONTEXT) if m in text), None)
        with self._lock:
            self.requests[marker] += 1
            call = self.requests[marker]
            arrived = self._arrived.setdefault(marker, threading.Event()) if found else None
        if marker == ONCE:
            return marker, call == 1
        if marker == CONTEXT:
            return marker, True
        if found:
            samples = int(found.group(1))
            if call == samples:
                arrived.set()
            if call <= samples:
                arrived.wait(timeout=120)
            return marker, call == 1 or call > samples
        return marker, False

    def answer(self, path: str, raw: bytes) -> tuple[int, dict]:
        body = json.loads(raw)
        marker, refused = self._refuses(json.dumps(body.get("messages", "")))
        if refused:
            with self._lock:
                self.refused[marker] += 1
            message = CONTEXT_ERROR if marker == CONTEXT else f"judge refused the request ({marker})"
            return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
        if body.get("model") != self.model:
            return 404, {"error": {"message": f"model {body.get('model')!r} is not served here (only {self.model!r})"}}
        body["model"] = self.engine_model
        request = urllib.request.Request(
            self.engine_url + path.removeprefix("/v1"),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310 (loopback)
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
