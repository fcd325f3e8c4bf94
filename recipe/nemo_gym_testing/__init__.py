"""Test support for the NeMo Gym recipe: nothing here is part of what a user deploys.

`cpu_training` runs verl's real trainer (`python -m verl.trainer.main_ppo`) on a machine without a GPU, so the
recipe's CI and demo exercise the whole training loop through the plugin. Users on GPU clusters never import it.
"""
