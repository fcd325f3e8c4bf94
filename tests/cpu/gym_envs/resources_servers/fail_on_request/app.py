# SPDX-License-Identifier: Apache-2.0
"""`fail_on_request`: a NeMo Gym 0.7 resources server for the tests, whose verify fails with HTTP 500 (an
infrastructure failure: the agent's `/run` then fails) on the rows whose prompt asks for it:

- `FAIL_ONCE`: the first verify of the prompt fails, every later one passes (a transient fault: a retry recovers);
- `FAIL_FIRST_OF_<k>`: the first of the prompt's k samples fails, and so does every verify after the k-th (its
  retries): a fault persistent for one sample while its k - 1 siblings pass. The first k verifies wait for each
  other (up to 120 s), so which call is a retry never depends on timing;
- `FAIL_RATE_<p>`: every verify fails with probability p % (benchmarks/bench_load.py --env flaky).

Every verify that passes scores the share of the answer's non-whitespace characters that are ASCII letters (a
graded reward, so the samples of one prompt differ). NeMo Gym starts it as a script in its own process.
"""

import asyncio
import random
import re
from collections import defaultdict
from typing import ClassVar

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from pydantic import PrivateAttr

FIRST_OF = re.compile(r"FAIL_FIRST_OF_(\d+)")
FAIL_RATE = re.compile(r"FAIL_RATE_(\d+)")


class FailOnRequestConfig(BaseResourcesServerConfig):
    pass


class FailOnRequestServer(SimpleResourcesServer):
    config: FailOnRequestConfig
    # No Ray in this server: NeMo Gym 0.7 then skips connecting it to its Ray cluster (0.4 ignores the key).
    ray_enabled: ClassVar[bool] = False
    _calls: dict = PrivateAttr(default_factory=lambda: defaultdict(int))
    _arrived: dict = PrivateAttr(default_factory=lambda: defaultdict(asyncio.Event))

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        prompt = " ".join(str(item.get("content")) for item in body.responses_create_params.model_dump()["input"])
        self._calls[prompt] += 1
        call = self._calls[prompt]
        if (rate := FAIL_RATE.search(prompt)) and random.random() < int(rate.group(1)) / 100:
            raise RuntimeError(f"fail_on_request: FAIL_RATE_{rate.group(1)}")
        if "FAIL_ONCE" in prompt and call == 1:
            raise RuntimeError("fail_on_request: FAIL_ONCE, first call")
        if found := FIRST_OF.search(prompt):
            samples = int(found.group(1))
            if call == samples:
                self._arrived[prompt].set()
            if call <= samples:
                await asyncio.wait_for(self._arrived[prompt].wait(), timeout=120)
            if call == 1 or call > samples:
                raise RuntimeError(f"fail_on_request: FAIL_FIRST_OF_{samples}, call {call}")
        text = "".join(
            content.text
            for item in body.response.output
            if item.type == "message"
            for content in item.content
            if content.type == "output_text"
        )
        counted = [c for c in text if not c.isspace()]
        letters = sum(c.isascii() and c.isalpha() for c in counted)
        return BaseVerifyResponse(**body.model_dump(), reward=letters / len(counted) if counted else 0.0)


if __name__ == "__main__":
    FailOnRequestServer.run_webserver()
