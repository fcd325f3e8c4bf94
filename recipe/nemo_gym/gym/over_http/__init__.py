# SPDX-License-Identifier: Apache-2.0
"""A running NeMo Gym over HTTP, whoever started it: its head server, where rows go, a batch under a deadline,
liveness probes, and `connection.GymConnection`, which composes them. Nothing is imported here."""
