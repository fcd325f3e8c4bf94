# SPDX-License-Identifier: Apache-2.0
"""A right and a wrong answer for one example row of each NeMo Gym resources server the suite runs, one module per
shipped environments file (`recipe/nemo_gym/configs/`); see `tests/support/cpu_policy/answers.py` for the form."""
