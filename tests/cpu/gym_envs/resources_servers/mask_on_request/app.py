# SPDX-License-Identifier: Apache-2.0
"""`mask_on_request`: a NeMo Gym 0.7 resources server for the tests, whose verify reports what Gym 0.7's own
environments report when their infrastructure fails (`mask_sample`, `failure_kind`; e.g. `nemo_gym.judge` for an
unavailable judge): on a row whose prompt holds MASKME. Other rows get reward 1.

NeMo Gym starts it as a script in its own process; tests/cpu/integration/test_gym_runtime.py runs it from this folder.
"""

from typing import ClassVar

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class MaskOnRequestConfig(BaseResourcesServerConfig):
    pass


class MaskOnRequestServer(SimpleResourcesServer):
    config: MaskOnRequestConfig
    # No Ray in this server: NeMo Gym 0.7 then skips connecting it to its Ray cluster (0.4 ignores the key).
    ray_enabled: ClassVar[bool] = False

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        prompt = " ".join(str(item.get("content")) for item in body.responses_create_params.model_dump()["input"])
        if "MASKME" in prompt:
            return BaseVerifyResponse(
                **body.model_dump(),
                reward=0.0,
                mask_sample=True,
                failure_kind="judge_failed",
                failure_reason="the judge did not answer",
            )
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    MaskOnRequestServer.run_webserver()
