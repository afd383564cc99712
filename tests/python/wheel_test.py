"""The installed shardsync wheel (run by wheel_test.sh with the virtual environment's
Python, from a folder outside the source tree): it is the copy in the environment, its
generated modules are submodules of the package and sys.path is left alone, a message
round-trips through them, and its metadata names the version and the dependencies.

    python - VENV VERSION < wheel_test.py
"""

import importlib
import importlib.metadata
import os
import pickle
import sys

import grpc

venv, version = sys.argv[1], sys.argv[2]
failures = []


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + str(detail) if detail else ''}", flush=True)
    if not ok:
        failures.append(what)


path_before = list(sys.path)
import shardsync  # noqa: E402  (a failure here is the test's failure, with the traceback)

site = os.path.realpath(venv)
check("shardsync.__file__ is inside the virtual environment",
      os.path.realpath(shardsync.__file__).startswith(site + os.sep), shardsync.__file__)
check("importing shardsync left sys.path as it was", sys.path == path_before,
      [p for p in sys.path if p not in path_before])
check("no _generated folder on sys.path", not any("_generated" in p for p in sys.path), sys.path)

from shardsync import layout_pb2, shardsync_pb2, shardsync_pb2_grpc  # noqa: E402

for module in (layout_pb2, shardsync_pb2, shardsync_pb2_grpc):
    name = module.__name__.rpartition(".")[2]
    check(f"{module.__name__} is shardsync's submodule, in the package's folder",
          module.__name__ == f"shardsync.{name}"
          and os.path.dirname(module.__file__) == os.path.dirname(shardsync.__file__), module.__file__)
    check(f"shardsync.{name} is exported", getattr(shardsync, name, None) is module)
    check(f"no top-level module {name} was loaded", name not in sys.modules)
    try:
        importlib.import_module(name)
        check(f"`import {name}` fails (nothing puts the package's folder on sys.path)", False)
    except ModuleNotFoundError:
        check(f"`import {name}` fails (nothing puts the package's folder on sys.path)", True)
check("import shardsync.shardsync_pb2 gives the same module",
      importlib.import_module("shardsync.shardsync_pb2") is shardsync_pb2)

# A message of shardsync.proto holding one of layout.proto, through the package's helpers.
layout = shardsync.zero3_partition("w", (64, 32), "bfloat16", world=4, dp_rank=1, buffer="flat", base=128)
request = shardsync_pb2.RegisterRequest(client_id="trainer-1", role=shardsync_pb2.SOURCE, tensors=[layout])
request.buffers.add(name="flat", bytes=4096, handle=shardsync_pb2.MemoryHandle(shm_name="/x", device=-1))
data = request.SerializeToString()
parsed = shardsync_pb2.RegisterRequest.FromString(data)
check(f"RegisterRequest round-trips ({len(data)} bytes)", parsed == request and len(data) > 0)
check("its class is named in the package (pickle finds it)",
      type(request).__module__ == "shardsync.shardsync_pb2" and pickle.loads(pickle.dumps(request)) == request,
      type(request).__module__)
check("its TensorLayout is layout_pb2's", type(parsed.tensors[0]) is layout_pb2.TensorLayout
      and parsed.tensors[0].flat_placements[0].buffer == "flat", type(parsed.tensors[0]).__qualname__)
check("shardsync_pb2_grpc.AgentStub on a channel",
      shardsync_pb2_grpc.AgentStub(grpc.insecure_channel("unix:/nonexistent")) is not None)

check(f"installed version is common/version.h's {version}",
      importlib.metadata.version("shardsync") == version, importlib.metadata.version("shardsync"))
requires = importlib.metadata.requires("shardsync") or []
check("requires grpcio and protobuf; torch only as an extra",
      any(r.startswith("grpcio") for r in requires) and any(r.startswith("protobuf") for r in requires)
      and all("extra ==" in r for r in requires if r.startswith("torch")) and any(r.startswith("torch") for r in requires),
      requires)
files = [str(f) for f in importlib.metadata.files("shardsync")]
check("the wheel has no native library and no _generated folder",
      not any(f.endswith(".so") or "_generated" in f for f in files),
      sorted(f for f in files if f.endswith(".py")))

if failures:
    print(f"FAILED: {len(failures)} check(s): {failures}", flush=True)
    sys.exit(1)
print("PASSED: every check", flush=True)
