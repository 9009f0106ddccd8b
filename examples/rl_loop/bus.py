"""A thin client of Conclave's bus for the example's processes: gRPC stubs
generated at start from the repository's proto/bus.proto (grpcio-tools),
the bearer key as call metadata, and the two HTTP calls of weight sync."""

import argparse
import importlib
import json
import os
import sys
import tempfile
import urllib.request

from grpc_tools import protoc
import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "proto")


def stubs():
    """Generates bus_pb2 / bus_pb2_grpc into a temporary directory."""
    out = tempfile.mkdtemp(prefix="conclave-stubs-")
    code = protoc.main([
        "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
        f"--grpc_python_out={out}", os.path.join(PROTO_DIR, "bus.proto"),
    ])
    if code != 0:
        sys.exit(f"protoc could not compile {PROTO_DIR}/bus.proto")
    sys.path.insert(0, out)
    return importlib.import_module("bus_pb2"), importlib.import_module("bus_pb2_grpc")


def arguments():
    """The options both processes take."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key")
    parser.add_argument("--model", required=True)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64)
    return parser.parse_args()


class Conclave:
    def __init__(self, url, key=None):
        self.url = url.rstrip("/")
        self.key = key
        self.pb, grpc_mod = stubs()
        target = self.url.split("://", 1)[-1]
        self.channel = grpc.insecure_channel(target)
        self.bus = grpc_mod.BusStub(self.channel)
        self.metadata = [("authorization", f"Bearer {key}")] if key else []

    def http(self, path, body):
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST",
            headers={"content-type": "application/json",
                     **({"authorization": f"Bearer {self.key}"} if self.key else {})})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
