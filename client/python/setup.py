"""Builds the shardsync client from this folder, offline:

    python3 -m venv --system-site-packages .venv        # sees Debian's grpcio, protobuf, setuptools
    .venv/bin/pip install --no-build-isolation client/python

The message modules (layout_pb2, shardsync_pb2, shardsync_pb2_grpc) are generated
while building, from ../../proto by the system's protoc and grpc_python_plugin, and
made package-relative by package_imports.py, as the Bazel build makes them. The
version is common/version.h's kVersion. Everything else is in pyproject.toml.
"""

import os
import re
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROTOS = ("layout.proto", "shardsync.proto")


def version() -> str:
    with open(os.path.join(ROOT, "common", "version.h"), encoding="utf-8") as f:
        found = re.search(r'^inline constexpr char kVersion\[\] = "(.*)";$', f.read(), re.MULTILINE)
    if not found:
        sys.exit("setup.py: no kVersion in common/version.h")
    return found[1]


class BuildWithMessages(build_py):
    """build_py, then the message modules generated into the built package."""

    def run(self) -> None:
        super().run()
        out = os.path.join(self.build_lib, "shardsync")
        proto = os.path.join(ROOT, "proto")
        subprocess.run(["protoc", f"--proto_path={proto}", f"--python_out={out}", f"--grpc_out={out}",
                        "--plugin=protoc-gen-grpc=" + os.environ.get("GRPC_PYTHON_PLUGIN", "/usr/bin/grpc_python_plugin")]
                       + [os.path.join(proto, p) for p in PROTOS], check=True)
        os.remove(os.path.join(out, "layout_pb2_grpc.py"))  # layout.proto has no services
        generated = [os.path.join(out, m) for m in ("layout_pb2.py", "shardsync_pb2.py", "shardsync_pb2_grpc.py")]
        subprocess.run([sys.executable, os.path.join(HERE, "package_imports.py")] + generated, check=True)


setup(version=version(), cmdclass={"build_py": BuildWithMessages})
