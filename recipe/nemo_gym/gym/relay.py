# SPDX-License-Identifier: Apache-2.0
"""`PolicyRelay`: one HTTP address in front of verl's policy servers, for a NeMo Gym that takes only one.

Why: an attached Gym learns the policy's address from its model server's `endpoint_file` (Gym 0.7's `vllm_model`),
which holds one URL, and verl may run several vLLM servers. With several, attach mode publishes this relay's URL.

Contract:
- Every request is passed on whole (method, path, query, body, `Content-Type` and `Authorization`) to one policy
  server, and its answer comes back whole (status, body, `Content-Type`): token IDs, log-probs and error bodies
  are not touched. A server that cannot be reached or drops the connection is answered with HTTP 502 naming it
  (Gym retries or fails the episode; the batch's policy health checks name a server that stays down).
- Session affinity: every call of one episode goes to the server its first call went to, so the later calls find
  the episode's history in that server's prefix cache. An episode is known by the conversation id Gym 0.7's
  `vllm_model` adds to each call when its `forward_session_id_as_conversation_id` is on (one per Gym session, i.e.
  per episode; `conversation_key`, pure); vLLM ignores the field. A call without one, and an episode's first call,
  goes to the server with the fewest requests in flight, ties round-robin (`replicas.pick_server`). Affinity is
  for speed only: each call carries its whole history (the token splice keeps no state in the server), so any server
  answers any turn exactly. `affinity=False` spreads every call (a benchmark's comparison).
- `start(host, port)` binds (port 0: a free one) on the event loop it is awaited on; `close()` stops it there.
"""

from __future__ import annotations

import re
import socket
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from recipe.nemo_gym.gym.over_http.client import server_root
from recipe.nemo_gym.gym.replicas import pick_server

# Request headers passed on; the rest (Host, Content-Length, hop-by-hop) belong to each connection.
_FORWARDED_HEADERS = ("Content-Type", "Authorization", "Accept")
# `"conversation_params": {"conversation_id": "<id>"}`, the key Gym 0.7.0's vllm_model adds to a chat request body
# (`forward_session_id_as_conversation_id`). Searched in the bytes, not parsed: a request holds the episode's whole
# history. Text inside a JSON string cannot match: its quotes are escaped (`\"`).
_CONVERSATION_ID = re.compile(rb'"conversation_params"\s*:\s*\{\s*"conversation_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
SESSIONS_KEPT = 1 << 16  # episodes remembered for affinity, least recently used forgotten first


def conversation_key(body: bytes) -> bytes | None:
    """The conversation id of a chat request body, or None when it has none."""
    match = _CONVERSATION_ID.search(body)
    return match.group(1) if match else None


class Affinity:
    """Which server each conversation was sent to, for its next calls; at most `capacity` remembered."""

    def __init__(self, capacity: int = SESSIONS_KEPT):
        self.capacity = capacity
        self.servers: OrderedDict[bytes, int] = OrderedDict()

    def server_for(self, key: bytes, in_flight: Sequence[int], start: int) -> tuple[int, bool]:
        """`(server index, whether the conversation had been seen)`: its server, else the least busy one."""
        known = self.servers.get(key)
        if known is not None:
            self.servers.move_to_end(key)
            return known, True
        chosen = pick_server(in_flight, start)
        self.servers[key] = chosen
        if len(self.servers) > self.capacity:
            self.servers.popitem(last=False)
        return chosen, False


class PolicyRelay:
    """Spreads HTTP requests over verl's policy servers (see the module docstring)."""

    def __init__(self, base_urls: Sequence[str], *, affinity: bool = True):
        if not base_urls:
            raise ValueError("PolicyRelay needs at least one policy server")
        self.roots = tuple(server_root(u) for u in base_urls)
        self.in_flight = [0] * len(self.roots)
        self.served = [0] * len(self.roots)
        self.affinity = Affinity() if affinity else None
        self.pinned = 0  # calls sent to their conversation's server (affinity's later calls)
        self.paths: Counter[str] = Counter()  # requests by path, for diagnostics
        self.port: int | None = None
        self._next = 0
        self._runner: Any = None
        self._session: Any = None

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on `host:port` (0: any free port); return the bound port."""
        import aiohttp
        from aiohttp import web

        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # A socket bound here, so the port chosen for port 0 is known (TCPSite does not expose it).
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        await web.SockSite(self._runner, sock).start()
        self.port = sock.getsockname()[1]
        return self.port

    async def _handle(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        body = await request.read()
        key = conversation_key(body) if self.affinity is not None else None
        if key is not None:
            i, seen = self.affinity.server_for(key, self.in_flight, self._next)
            self.pinned += seen
        else:
            i = pick_server(self.in_flight, self._next)
        self._next = (i + 1) % len(self.roots)
        self.in_flight[i] += 1
        self.served[i] += 1
        self.paths[request.path] += 1
        url = self.roots[i] + str(request.rel_url)
        headers = {k: request.headers[k] for k in _FORWARDED_HEADERS if k in request.headers}
        try:
            async with self._session.request(request.method, url, data=body, headers=headers) as response:
                payload = await response.read()
                content_type = response.headers.get("Content-Type")
                return web.Response(
                    status=response.status, body=payload, headers={"Content-Type": content_type} if content_type else {}
                )
        except aiohttp.ClientError as e:
            return web.Response(status=502, text=f"policy relay: policy server {self.roots[i]} failed: {e!r}")
        finally:
            self.in_flight[i] -= 1

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
