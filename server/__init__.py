"""The multi-process gRPC server: front end (asyncio + grpc.aio), workers, control plane."""
