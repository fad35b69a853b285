"""Generates lowtide's gRPC code from proto/lowtide.proto at build and install time."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def generate_proto() -> None:
    """proto/lowtide.proto -> proto/lowtide_pb2{,_grpc}.py{,i}, importable as lowtide.proto."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as out:
        status = protoc.main(
            [
                "protoc",
                f"-Ilowtide/proto={ROOT / 'proto'}",  # virtual path: generated imports say lowtide.proto
                f"-I{well_known}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                f"--pyi_out={out}",
                "lowtide/proto/lowtide.proto",
            ]
        )
        if status != 0:
            raise RuntimeError("protoc failed on proto/lowtide.proto")
        for generated in (Path(out) / "lowtide" / "proto").iterdir():
            shutil.copyfile(generated, ROOT / "proto" / generated.name)


class BuildPy(build_py):
    def run(self) -> None:
        generate_proto()
        super().run()


setup(cmdclass={"build_py": BuildPy})
