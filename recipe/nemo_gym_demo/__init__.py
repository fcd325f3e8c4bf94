# SPDX-License-Identifier: Apache-2.0
"""The demo: `./run_demo.sh` (`python -m recipe.nemo_gym_demo`) trains a tiny model with verl's `main_ppo` and this
plugin on a NeMo Gym blend, on a machine without a GPU (the launcher's `backend: cpu`).

- `__main__`: the demo's job and its embedded default;
- `console`: a CPU job written as a job file and run through the launcher, with a console of one line per step;
- `data`: NeMo Gym's example rows and ours, as training reads them;
- `tiny_model`: a tiny random-weight Qwen3 with the real Qwen3 tokenizer, built locally (nothing downloaded).

The tests and benchmarks reuse `console`, `data` and `tiny_model`; nothing here imports the tests' support code.
"""
