"""The prompt dispatcher of seed 003's loop, against Conclave: waits
(without polling) for the trainer to share the results topic in the KV,
then for each sync/weights_ready sends a rollout of its prompts. Conclave
dispatches them over the pool and publishes each result on the topic.

    python dispatcher.py --url http://127.0.0.1:8080 --model qwen --iterations 3 --prompts 64"""

import datetime
import json
import sys

from bus import Conclave, arguments


def main():
    args = arguments()
    conclave = Conclave(args.url, args.key)
    pb, bus, md = conclave.pb, conclave.bus, conclave.metadata
    since = datetime.datetime.now(datetime.timezone.utc).isoformat()

    topic = bus.KVGet(pb.KVGetRequest(key="inference_response_topic", wait_s=120), metadata=md)
    print(f"results go to {json.loads(topic.value)}", file=sys.stderr)
    sent = 0
    ready = bus.Subscribe(pb.SubscribeRequest(subjects=["sync/weights_ready"], since=since),
                          metadata=md)
    for delivery in ready:
        if delivery.WhichOneof("kind") != "message":
            continue
        update = json.loads(delivery.message.payload)
        if update.get("model") != args.model:
            continue
        prompts = [f"iteration {update['version']} prompt {i}" for i in range(args.prompts)]
        reply = bus.Rollout(pb.RolloutRequest(
            model=args.model, prompts=prompts,
            sampling=pb.Sampling(max_tokens=16, temperature=0.7, return_token_ids=True),
            metadata_json=json.dumps({"iteration": update["version"]})), metadata=md)
        print(f"rollout {reply.rollout_id} for weights {update['version']}", file=sys.stderr)
        sent += 1
        if sent == args.iterations:
            break
    ready.cancel()


if __name__ == "__main__":
    main()
