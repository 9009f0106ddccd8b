"""The trainer of seed 003's loop, against Conclave: shares the results
topic through the KV, and for each iteration pauses the pool, "updates"
the weights (the NCCL transfer stays with a real trainer), commits the
version (Conclave publishes sync/weights_ready) and collects the
rollout's results, checking each carries token ids and that version. A
completion it sends while the pool is paused must wait and complete after
the commit.

    python trainer.py --url http://127.0.0.1:8080 --model qwen --iterations 3 --prompts 64

Prints a JSON summary; exits 1 if a result is missing or wrong."""

import datetime
import json
import queue
import sys
import threading
import time

from bus import Conclave, arguments

RESULTS = "inference/results/shared"


def main():
    args = arguments()
    conclave = Conclave(args.url, args.key)
    pb, bus, md = conclave.pb, conclave.bus, conclave.metadata
    since = datetime.datetime.now(datetime.timezone.utc).isoformat()

    inbox = queue.Queue()

    def listen():
        request = pb.SubscribeRequest(subjects=[RESULTS, "rollout.completed"], since=since)
        for delivery in bus.Subscribe(request, metadata=md):
            if delivery.WhichOneof("kind") == "message":
                message = delivery.message
                inbox.put((message.subject, json.loads(message.payload)))

    threading.Thread(target=listen, daemon=True).start()
    bus.KVPut(pb.KVPutRequest(key="inference_response_topic", value=json.dumps(RESULTS).encode()),
              metadata=md)

    summary, ok = [], True
    for version in range(1, args.iterations + 1):
        begun = conclave.http(f"/gateway/pools/{args.model}/weights/begin", {})
        # A call sent while the pool is paused waits, then completes under
        # the new weights.
        paused_call = {}

        def call_while_paused():
            answer = conclave.http("/v1/completions",
                                   {"model": args.model, "prompt": "sent during begin", "max_tokens": 4})
            paused_call.update(done_at=time.monotonic(), ok=bool(answer.get("choices")))

        caller = threading.Thread(target=call_while_paused)
        caller.start()
        time.sleep(0.05)  # the weight transfer of a real trainer
        committed_at = time.monotonic()
        conclave.http(f"/gateway/pools/{args.model}/weights/commit", {"version": version})
        caller.join(timeout=120)
        waited = paused_call.get("ok", False) and paused_call["done_at"] >= committed_at
        results, completed = {}, None
        while completed is None or len(results) < args.prompts:
            subject, data = inbox.get(timeout=120)
            if subject == "rollout.completed":
                completed = data
            else:
                results[data["index"]] = data
        versions = sorted({r.get("weights_version") for r in results.values()}, key=str)
        with_ids = sum(1 for r in results.values()
                       if "error" not in r and r["outputs"] and r["outputs"][0]["token_ids"])
        fine = (len(results) == args.prompts and with_ids == args.prompts
                and versions == [version] and waited)
        ok = ok and fine
        summary.append({"version": version, "results": len(results), "with_token_ids": with_ids,
                        "weights_versions": versions, "paused_ms": begun["waited_ms"],
                        "call_sent_during_begin_waited_and_completed": waited,
                        "completed": completed, "replicas": sorted({r.get("replica") for r in results.values()})})
    print(json.dumps({"ok": ok, "iterations": summary}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
