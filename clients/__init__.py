"""Clients of a lowtide server: Python client, CLI helpers, Spark connector."""
