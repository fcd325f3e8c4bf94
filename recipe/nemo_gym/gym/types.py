# SPDX-License-Identifier: Apache-2.0
"""The values `gym/` is handed by its callers, in one small module that imports nothing else of `gym/`.

- `PolicyServers`: verl's policy servers, which NeMo Gym's model server calls (the manager finds them,
  `verl_servers.py`; the job config, the connection and the relay read them).
- `CollectSettings`: how the results of a batch are read into episodes (`packing.episode.read_episode`'s limits),
  and by how many collect processes (`over_http/collect_processes.py`; 0: in the manager's own process).
"""

from __future__ import annotations

from dataclasses import dataclass

from recipe.nemo_gym.gym.errors import GymConfigError


@dataclass(frozen=True)
class PolicyServers:
    """verl's policy servers, known only once the trainer runs: their OpenAI base URLs and the model they serve."""

    base_urls: tuple[str, ...]
    model_name: str

    def __post_init__(self) -> None:
        urls = (self.base_urls,) if isinstance(self.base_urls, str) else tuple(str(u) for u in self.base_urls)
        object.__setattr__(self, "base_urls", urls)
        if not urls:
            raise GymConfigError("no policy server: give the base URLs of verl's vLLM servers")
        bad = [url for url in urls if not url.startswith(("http://", "https://"))]
        if bad:
            raise GymConfigError(f"policy server base URLs {bad} are not http(s) URLs")
        if not self.model_name:
            raise GymConfigError("the policy servers' model name is empty")


@dataclass(frozen=True)
class CollectSettings:
    """How results are read into episodes where they arrive: by `processes` collect processes, with the trainer's
    prompt length and the reward components it requires (`packing.episode.read_episode`)."""

    processes: int
    max_prompt_length: int | None = None
    required_components: tuple[str, ...] = ()
