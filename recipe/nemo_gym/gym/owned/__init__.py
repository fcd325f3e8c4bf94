# SPDX-License-Identifier: Apache-2.0
"""A NeMo Gym process tree the plugin owns: started (`launch.OwnedGym`), supervised, stopped, watched by
`gym.watchdog` in case the trainer dies without a word. Nothing is imported here."""
