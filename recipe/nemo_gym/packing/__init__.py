# SPDX-License-Identifier: Apache-2.0
"""Pure packing: NeMo Gym results become verl 0.9.1 rollout tensors, in two steps with one module each.

- `episode`: one NeMo Gym result dict -> `Episode` (token segments, contiguity checked) or `EpisodeDataError`.
- `batch`: `Episode`s and `EpisodeFailure`s -> one batch's padded tensors (`BatchPacker`, `PackedBatch`).
- `stats`: `PackStats`, the per-row statistics packed beside the batch, and their batch-level metrics.

No Ray, HTTP or vLLM import anywhere here; `agent_loop` packs every batch with them.
"""
