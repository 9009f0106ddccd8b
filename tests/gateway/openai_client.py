"""The official OpenAI Python SDK against the Conclave gateway.

Usage: openai_client.py BASE_URL SLUG_BASE_URL
Prints one JSON object with what it saw; exits non-zero on any failure.
"""
import json
import sys

from openai import OpenAI

base_url, slug_base_url = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
seen = {}

# Plain.
reply = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "hello"}]
)
seen["plain"] = reply.choices[0].message.content
seen["plain_usage"] = reply.usage.completion_tokens

# Streaming, chunk by chunk.
pieces = []
for chunk in client.chat.completions.create(
    model="m",
    messages=[{"role": "user", "content": "hello"}],
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
seen["stream_chunks"] = len(pieces)
seen["stream"] = "".join(pieces)

# Tool calls, plain and streamed.
tools = [{
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}]
reply = client.chat.completions.create(
    model="tools", messages=[{"role": "user", "content": "list files"}], tools=tools
)
call = reply.choices[0].message.tool_calls[0]
seen["tool_call"] = {"name": call.function.name, "arguments": json.loads(call.function.arguments)}
arguments = ""
for chunk in client.chat.completions.create(
    model="tools", messages=[{"role": "user", "content": "list files"}], tools=tools, stream=True
):
    if chunk.choices and chunk.choices[0].delta.tool_calls:
        arguments += chunk.choices[0].delta.tool_calls[0].function.arguments or ""
seen["streamed_tool_arguments"] = json.loads(arguments)

# Legacy completions and the model list.
seen["completion"] = client.completions.create(model="m", prompt="once upon a").choices[0].text
seen["models"] = sorted(m.id for m in client.models.list())

# Through a metadata slug.
slugged = OpenAI(base_url=slug_base_url, api_key="unused", max_retries=0)
seen["slug"] = slugged.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "hi"}]
).choices[0].message.content

# An error the SDK raises as such.
try:
    client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    seen["unknown_model"] = "no error"
except Exception as error:  # openai.NotFoundError
    seen["unknown_model"] = type(error).__name__

print(json.dumps(seen))
