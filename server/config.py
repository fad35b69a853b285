"""Server configuration: command-line options over a TOML file over defaults.

host = "127.0.0.1"        # bind address (loopback by default)
port = 50051              # 0: pick a free port and print it
workers = 2               # worker processes (default: the number of cores)
ray = ""                  # "": workers are local processes; auto | local | host:port | ray://host:port:
                          # workers are actors of that Ray cluster (the ray extra, docs/ray.md)
worker_cpus = 1.0         # with ray: the CPUs each worker actor reserves
ray_node_ip = ""          # with ray = "local": the address its private cluster listens on;
                          # "": 127.0.0.1 (nothing of it reachable from another machine)
restart_strategy = "exponential-delay"  # placing a lost Ray worker again (Flink's strategies):
                          # exponential-delay | fixed-delay
restart_initial_backoff_s = 1.0   # the wait after the first failed attempt (fixed-delay: every wait)
restart_max_backoff_s = 60.0      # the longest wait between attempts
restart_backoff_multiplier = 2.0  # each wait this many times the one before
restart_reset_backoff_threshold_s = 300.0  # a worker up this long without dying: waits start over
restart_attempt_timeout_s = 60.0  # an actor not answering by then is killed and created again
restart_max_attempts = 0  # failed attempts in a row before the server stops; 0: never gives up
metrics_port = 9464       # Prometheus exposition; 0: a free port; -1: off
metrics_host = "127.0.0.1"  # the exposition's bind address (not host's: metrics stay on loopback)
state_dir = ""            # durable state (input log and checkpoints) here; "": memory only
checkpoint_interval_s = 60.0   # with state_dir: checkpoint this often (seconds; 0: never) ...
checkpoint_log_bytes = 134217728  # ... or once the log has grown this much since the last one
fsync = "no"              # input log: "no" (written to the OS before the ack: survives a crash of
                          # any lowtide process), "always" (fsync before the ack: survives a power
                          # loss; group commit), "everysec" (fsync once a second)
max_message_bytes = 67108864
max_batch_rows = 1000000
max_streams = 1000
max_queries = 1000
max_query_state_bytes = 1073741824
max_state_bytes_total = 4294967296  # window state of all queries together; past it the query that
                          # grew most fails RESOURCE_EXHAUSTED, the others go on
max_windows_per_tuple = 100000    # RANGE / SLIDE of a window: a query over it is refused
max_windows_per_step = 1000000    # windows one punctuation may make a landmark query emit
max_strings = 5000000     # strings one stream may add to the string pool (a batch adding more:
                          # RESOURCE_EXHAUSTED)
max_string_bytes = 536870912  # ... and the bytes of memory they take (each string's object and entry)
retained_items = 1024     # result items kept per query for Subscribe(from_oldest / from_offset) ...
retained_bytes = 268435456  # ... and at most this many bytes of them (both bound: oldest evicted)
max_subscriber_bytes = 67108864  # one subscription's unread results; past it: RESOURCE_EXHAUSTED
max_subscriber_bytes_total = 536870912  # result messages being sent to all subscribers at once; the
                          # subscription that would pass it ends RESOURCE_EXHAUSTED
staging_timeout_s = 600.0 # staged parts (Stage: Spark's format("lowtide") writer) not committed
                          # within this many seconds are dropped
max_staged_bytes = 1073741824  # Arrow bytes staged and not yet committed (more: RESOURCE_EXHAUSTED)
max_pending_bytes = 536870912  # bytes held for multi-part Ingest batches not yet applied, over all
                          # calls (a part past it: its call ends RESOURCE_EXHAUSTED)
flush_every = 0           # smooth emission: one result row per N input tuples; 0: off
flush_max_windows = 2     # ... and no window more than this many behind punctuation
tls_cert = ""             # PEM certificate (chain): serve TLS; needs tls_key, and the reverse
tls_key = ""              # PEM private key (unencrypted) of tls_cert
tokens = ""               # TOML file whose [tokens] table maps each token to admin|producer|reader
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from lowtide.errors import InvalidArgument
from lowtide.server.input_log import FSYNC_POLICIES
from lowtide.server.restart_strategy import RestartStrategy

# What --ray takes: Ray's own forms of a cluster address, and auto / local (see docs/ray.md).
RAY_ADDRESS = re.compile(r"auto|local|(ray://)?[\w.\-]+:\d+")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    workers: int = max(1, os.cpu_count() or 1)
    ray: str = ""
    worker_cpus: float = 1.0
    ray_node_ip: str = ""
    restart_strategy: str = "exponential-delay"
    restart_initial_backoff_s: float = 1.0
    restart_max_backoff_s: float = 60.0
    restart_backoff_multiplier: float = 2.0
    restart_reset_backoff_threshold_s: float = 300.0
    restart_attempt_timeout_s: float = 60.0
    restart_max_attempts: int = 0
    metrics_port: int = 9464
    metrics_host: str = "127.0.0.1"
    state_dir: str = ""
    fsync: str = "no"
    checkpoint_interval_s: float = 60.0
    checkpoint_log_bytes: int = 128 << 20
    max_message_bytes: int = 64 << 20
    max_batch_rows: int = 1_000_000
    max_streams: int = 1000
    max_queries: int = 1000
    max_query_state_bytes: int = 1 << 30
    max_state_bytes_total: int = 4 << 30
    max_windows_per_tuple: int = 100_000
    max_windows_per_step: int = 1_000_000
    max_strings: int = 5_000_000
    max_string_bytes: int = 512 << 20
    retained_items: int = 1024
    retained_bytes: int = 256 << 20
    max_subscriber_bytes: int = 64 << 20
    max_subscriber_bytes_total: int = 512 << 20
    staging_timeout_s: float = 600.0
    max_staged_bytes: int = 1 << 30
    max_pending_bytes: int = 512 << 20
    flush_every: int = 0
    flush_max_windows: int = 2
    tls_cert: str = ""
    tls_key: str = ""
    tokens: str = ""

    @staticmethod
    def load(path: str | Path | None = None, **overrides: Any) -> ServerConfig:
        """Defaults, then the TOML file (if any), then the non-None ``overrides``."""
        config = ServerConfig()
        known = {f.name: f.type for f in fields(ServerConfig)}
        if path:
            try:
                data = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise InvalidArgument(f"cannot read config {path}: {exc}") from exc
            data = data.get("server", data)
            unknown = sorted(set(data) - set(known))
            if unknown:
                raise InvalidArgument(f"unknown config key(s) in {path}: {', '.join(unknown)}")
            config = replace(config, **data)
        config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
        if config.workers < 1:
            raise InvalidArgument("workers must be at least 1")
        if config.ray and not RAY_ADDRESS.fullmatch(config.ray):
            raise InvalidArgument(
                f"ray must be auto, local or a cluster address (host:port, ray://host:port): {config.ray!r}"
            )
        if not config.worker_cpus > 0:
            raise InvalidArgument("worker_cpus must be more than 0")
        if config.ray_node_ip:
            if config.ray != "local":
                raise InvalidArgument("ray_node_ip (--ray-node-ip) is for ray = local: a cluster has its own")
            try:
                ipaddress.ip_address(config.ray_node_ip)
            except ValueError:
                raise InvalidArgument(f"ray_node_ip must be an IP address: {config.ray_node_ip!r}") from None
        problem = config.restart().problem()
        if problem:
            raise InvalidArgument(problem)
        if config.fsync not in FSYNC_POLICIES:
            raise InvalidArgument(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {config.fsync!r}")
        if bool(config.tls_cert) != bool(config.tls_key):
            raise InvalidArgument("--tls-cert and --tls-key (tls_cert, tls_key) go together: both or neither")
        if config.max_windows_per_tuple < 1 or config.max_windows_per_step < 1:
            raise InvalidArgument("max_windows_per_tuple and max_windows_per_step must be at least 1")
        if min(config.retained_items, config.retained_bytes, config.max_subscriber_bytes) < 0:
            raise InvalidArgument(
                "retained_items, retained_bytes and max_subscriber_bytes must not be negative"
            )
        if config.max_subscriber_bytes_total < config.max_message_bytes:
            raise InvalidArgument(  # else a result as wide as a message could reach no subscriber
                "max_subscriber_bytes_total must be at least max_message_bytes "
                f"({config.max_subscriber_bytes_total} < {config.max_message_bytes})"
            )
        if config.max_pending_bytes < 0:
            raise InvalidArgument("max_pending_bytes must not be negative")
        if config.max_state_bytes_total < 0:
            raise InvalidArgument("max_state_bytes_total must not be negative")
        if not config.staging_timeout_s > 0 or config.max_staged_bytes < 0:
            raise InvalidArgument("staging_timeout_s must be more than 0, max_staged_bytes not negative")
        if config.flush_every < 0 or config.flush_max_windows < 0:
            raise InvalidArgument("flush_every and flush_max_windows must not be negative")
        return config

    def restart(self) -> RestartStrategy:
        """How a lost Ray worker is placed again (see :mod:`lowtide.server.restart_strategy`)."""
        return RestartStrategy(
            self.restart_strategy,
            self.restart_initial_backoff_s,
            self.restart_max_backoff_s,
            self.restart_backoff_multiplier,
            self.restart_reset_backoff_threshold_s,
            self.restart_attempt_timeout_s,
            self.restart_max_attempts,
        )
