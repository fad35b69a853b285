"""Nexmark for the benchmarks and tests/nexmark: Flink's answers to its queries (flink_oracle.py,
run in .venv-pyflink). Its events come from lowtide.clients.nexmark."""
