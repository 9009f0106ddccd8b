"""A seed-000 client on grpcio: Deliberate, then both ways of reading the
result the seed names: a bus subscription (conclave.bus.v1.Bus.Subscribe
on agent.response.* and deliberation.completed) and polling
GetDeliberationResult. Prints one JSON summary line for the Rust test.

Usage: grpc_client.py HOST:PORT KEY
"""

import json
import sys
import tempfile
import threading

import grpc
from grpc_tools import protoc

PROTO = sys.argv[3] if len(sys.argv) > 3 else "proto"


def stubs():
    out = tempfile.mkdtemp(prefix="conclave-grpc-")
    for name in ("bus.proto", "orchestrator.proto"):
        code = protoc.main(["grpc_tools.protoc", f"-I{PROTO}", f"--python_out={out}",
                            f"--grpc_python_out={out}", name])
        if code != 0:
            sys.exit(f"protoc could not compile {PROTO}/{name}")
    sys.path.insert(0, out)
    import bus_pb2, bus_pb2_grpc, orchestrator_pb2, orchestrator_pb2_grpc  # noqa: E402
    return bus_pb2, bus_pb2_grpc, orchestrator_pb2, orchestrator_pb2_grpc


def main():
    target, key = sys.argv[1], sys.argv[2]
    bus_pb2, bus_grpc, orch_pb2, orch_grpc = stubs()
    metadata = [("authorization", f"Bearer {key}")]
    channel = grpc.insecure_channel(target)
    bus = bus_grpc.BusStub(channel)
    orchestrator = orch_grpc.OrchestratorStub(channel)

    seen = []
    subscribed = threading.Event()
    done = threading.Event()
    task = {}
    stream = bus.Subscribe(
        bus_pb2.SubscribeRequest(subjects=["agent.response.*", "deliberation.completed"]),
        metadata=metadata)

    def read():
        # The first delivery is not needed to know the subscription is open:
        # the server registers it before answering the headers.
        for delivery in stream:
            if delivery.WhichOneof("kind") != "message":
                continue
            message = delivery.message
            data = json.loads(message.payload)
            seen.append({"subject": message.subject, "data": data})
            if message.subject == "deliberation.completed" and data.get("task_id") == task.get("id"):
                done.set()
                return

    stream.initial_metadata()  # waits for the response headers
    subscribed.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    response = orchestrator.Deliberate(orch_pb2.DeliberateRequest(
        task_description="Write a Python function add(a, b)", role="DEV", num_agents=3,
        constraints=orch_pb2.Constraints(rubric="correct", requirements=["typed"]),
        aggregate="judge"), metadata=metadata)
    task["id"] = response.task_id
    assert response.status == "SUBMITTED", response
    if not done.wait(60):
        sys.exit("no deliberation.completed within 60 s")
    stream.cancel()
    result = orchestrator.GetDeliberationResult(
        orch_pb2.GetDeliberationResultRequest(task_id=response.task_id), metadata=metadata)
    try:
        orchestrator.GetDeliberationResult(
            orch_pb2.GetDeliberationResultRequest(task_id=response.task_id),
            metadata=[("authorization", "Bearer someone-elses-key")])
        other = "OK"
    except grpc.RpcError as e:
        other = e.code().name
    try:
        orchestrator.Deliberate(orch_pb2.DeliberateRequest(task_description="x", num_agents=5000),
                                metadata=metadata)
        invalid = "OK"
    except grpc.RpcError as e:
        invalid = e.code().name
    print(json.dumps({
        "task_id": response.task_id,
        "status": orch_pb2.DeliberationStatus.Name(result.status),
        "successful_responses": result.successful_responses,
        "agents": [r.agent_id for r in result.results],
        "authors": [r.proposal.author_id for r in result.results],
        "decision_method": result.decision.method,
        "decision_choice": result.decision.choice,
        "bus": [{"subject": m["subject"], "task_id": m["data"].get("task_id"),
                 "agent_id": m["data"].get("agent_id")} for m in seen],
        "other_key": other,
        "invalid": invalid,
    }))


if __name__ == "__main__":
    main()
