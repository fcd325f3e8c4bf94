# SPDX-License-Identifier: Apache-2.0
"""verl recipe plugin that trains on NVIDIA NeMo Gym environments.

Importing this package has no side effects; each module documents its own contract.
"""
