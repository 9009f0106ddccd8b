"""The official OpenAI Python SDK's Responses and embeddings APIs against
the Conclave gateway over `conclave sim` replicas, which start each answer
with their id.

Usage: openai_responses.py BASE_URL SLUG_BASE_URL PHASE
PHASE `both`: every replica is up; `one`: one was stopped.
Prints one JSON object with what it saw; exits non-zero on any failure
the script does not catch itself.
"""
import base64
import json
import struct
import sys

import openai
from openai import OpenAI

base_url, slug_base_url, phase = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
seen = {}


def replica(text):
    """The sim that wrote `text`: its first word."""
    return text.split(" ")[0]


def streamed(**kwargs):
    """A streamed response: its event types, deltas, and final response."""
    kinds, deltas, final = [], [], None
    for event in client.responses.create(stream=True, **kwargs):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            final = event.response
    return kinds, deltas, final


def error_name(call):
    try:
        call()
        return "no error"
    except openai.APIStatusError as error:
        return f"{type(error).__name__} {error.status_code}"


# A conversation, alternately streamed and not: every follow-up names the
# response before it, so it must reach the replica that stored that one
# (the other answers 404 and the SDK would raise).
first = client.responses.create(model="m", input="hello there")
chain = [replica(first.output_text)]
previous = first.id
for turn in range(6):
    if turn % 2:
        _, deltas, final = streamed(model="m", input="and then?", previous_response_id=previous)
        text = "".join(deltas)
        assert text == final.output_text, (text, final.output_text)
    else:
        final = client.responses.create(model="m", input="and then?", previous_response_id=previous)
        text = final.output_text
    chain.append(replica(text))
    previous = final.id
seen["chain"] = chain

# New conversations spread over the replicas (round robin).
seen["spread"] = sorted(
    {replica(client.responses.create(model="m", input="hi").output_text) for _ in range(4)}
)

kinds, deltas, final = streamed(model="m", input=[{"role": "user", "content": "a b c"}])
seen["stream_kinds"] = sorted(set(kinds))
seen["stream_first"], seen["stream_last"] = kinds[0], kinds[-1]
seen["stream_deltas"] = len(deltas)
seen["stream_text"] = "".join(deltas)[len(replica("".join(deltas))):]
seen["stream_usage"] = [final.usage.input_tokens, final.usage.output_tokens]
whole = client.responses.create(model="m", input="hello")
seen["whole_text"] = whole.output_text[len(replica(whole.output_text)):]
seen["whole_status"] = whole.status

# Embeddings: the SDK asks for base64 unless told; both decode alike.
one = client.embeddings.create(model="m", input="hello")
seen["embedding_dims"] = len(one.data[0].embedding)
listed = client.embeddings.create(model="m", input=["hello", "world"], encoding_format="float")
seen["embedding_count"] = len(listed.data)
seen["embedding_same"] = all(
    abs(a - b) < 1e-6 for a, b in zip(one.data[0].embedding, listed.data[0].embedding)
)
seen["embedding_differs"] = listed.data[0].embedding != listed.data[1].embedding
raw = client.embeddings.with_raw_response.create(
    model="m", input="hello", encoding_format="base64", dimensions=4
)
packed = json.loads(raw.text)["data"][0]["embedding"]
seen["base64_floats"] = len(struct.unpack("<4f", base64.b64decode(packed)))
seen["embedding_usage"] = listed.usage.prompt_tokens

if phase == "both":
    slugged = OpenAI(base_url=slug_base_url, api_key="unused", max_retries=0)
    seen["slug_response"] = bool(slugged.responses.create(model="m", input="hi").output_text)
    seen["slug_embedding"] = len(slugged.embeddings.create(model="m", input="x").data)
    seen["unknown_model"] = error_name(lambda: client.responses.create(model="nope", input="x"))
    seen["unknown_previous"] = error_name(
        lambda: client.responses.create(model="m", input="x", previous_response_id="resp_none")
    )
    seen["empty_input"] = error_name(lambda: client.embeddings.create(model="m", input=[]))
    seen["bad_format"] = error_name(
        lambda: client.embeddings.create(model="m", input="x", encoding_format="int8")
    )

print(json.dumps(seen))
