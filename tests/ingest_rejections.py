"""What a failed Ingest call raises in the client, for tests of a producer without a server:
the status, the reason and the trailing metadata naming the rejected message."""

from __future__ import annotations

import grpc


class Rejected(grpc.RpcError):
    """What a failed Ingest call raises in the client: status, reason, trailing metadata."""

    def __init__(self, kind: str, reason: str, message: int | None, applied: str | None = None) -> None:
        self._kind, self._reason = kind, reason
        self._metadata = [("lowtide-error", kind)] if kind else []
        if message is not None:
            self._metadata.append(("lowtide-message", str(message)))
        if applied is not None:
            self._metadata.append(("lowtide-applied", applied))

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT if self._kind else grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._reason

    def trailing_metadata(self) -> list[tuple[str, str]]:
        return self._metadata
