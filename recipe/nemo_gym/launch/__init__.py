# SPDX-License-Identifier: Apache-2.0
"""The launcher: one typed job file, checked once, composed into verl's command once, run and supervised once.

    python -m recipe.nemo_gym.launch check   JOB [--set key=value]... [verl overrides...]
    python -m recipe.nemo_gym.launch dry-run JOB ...   # the trainer's command, one argument per line; starts nothing
    python -m recipe.nemo_gym.launch ray-env JOB ...   # `export` lines for the Ray bootstrap (ray_on_slurm.sh)
    python -m recipe.nemo_gym.launch run     JOB ...   # main_ppo to its end; exit status the job's

- `job.py`: the job file as one pydantic model (`Job`), with `JOB__*` environment and `--set` overrides.
- `checks.py`: the data, the installed stack, NeMo Gym's environment, Megatron's modules.
- `compose.py`: the job into `main_ppo`'s overrides, the processes' environment and Ray's resources (pure).
- `supervise.py`: the trainer run in a process group of its own, stopped with grace, its leftovers removed and
  its error shown last.

The shell's only part is borrowing nodes: `ray_on_slurm.sh` starts Ray on every node of a Slurm allocation (or one
local head), runs `launch run` on the head node, and tears the nodes down. The submit scripts chain the two. Run
without the bootstrap (no `RAY_ADDRESS`), `launch run` lets the trainer start a Ray of its own, in a temporary folder
of the run; that is how the demo runs its job (`recipe/nemo_gym_demo/console.py`). `dry-run` and `ray-env` describe
the job under the bootstrap.
"""
