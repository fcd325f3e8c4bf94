# SPDX-License-Identifier: Apache-2.0
"""The recipe's tests. A package so that `tests.support` (fixtures and harnesses, imported by the tests, by Ray
workers and by the benchmarks with the repository on `PYTHONPATH`) is this repository's, not the `tests` package
that verl's wheel installs into site-packages."""
