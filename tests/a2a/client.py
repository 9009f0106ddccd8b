"""Drives Conclave's A2A server with the official Python SDK (`a2a-sdk`):
card discovery, send (blocking, streamed, returning at once), get, list,
cancel, subscribe to a running task, a task waiting on approval, a push
notification to a local receiver, another key refused and bad requests.

Usage: client.py URL KEY OTHER_KEY. Prints one JSON object of what it saw;
tests/a2a.rs asserts on it.
"""

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_data_part, new_message, new_text_message
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

url, key, other_key = sys.argv[1:4]
out = {}


def http(k):
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {k}"}, timeout=60)


def state(task):
    return TaskState.Name(task.status.state)


def texts(artifacts):
    return [p.text for a in artifacts for p in a.parts if p.text]


def user(text, context=None, task=None):
    return new_text_message(text, context_id=context, task_id=task, role=Role.ROLE_USER)


async def client(k, streaming=False, polling=False):
    config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http(k))
    return await ClientFactory(config).create_from_url(f"{url}/a2a/agent")


async def send(c, message, metadata=None):
    request = SendMessageRequest(message=message)
    if metadata:
        request.metadata.update(metadata)
    return [e async for e in c.send_message(request)]


async def error_of(coro):
    try:
        await coro
        return None
    except Exception as e:  # the SDK's A2A errors and the client's own
        return type(e).__name__


class Receiver(BaseHTTPRequestHandler):
    """A push-notification endpoint: keeps each POST and its token."""

    got = []
    done = threading.Event()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        state_name = body.get("statusUpdate", {}).get("status", {}).get("state")
        Receiver.got.append({"state": state_name,
                             "token": self.headers.get("X-A2A-Notification-Token")})
        if state_name == "TASK_STATE_COMPLETED":
            Receiver.done.set()
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


async def main():
    # Discovery: the card, with the key the card's scheme asks for.
    async with http(key) as h:
        card = await A2ACardResolver(h, f"{url}/a2a/agent").get_agent_card()
        out["card"] = {"name": card.name,
                       "url": card.supported_interfaces[0].url,
                       "binding": card.supported_interfaces[0].protocol_binding,
                       "version": card.supported_interfaces[0].protocol_version,
                       "streaming": card.capabilities.streaming,
                       "skills": [s.id for s in card.skills],
                       "schemes": list(card.security_schemes.keys())}
        root = await A2ACardResolver(h, url).get_agent_card()
        out["root_card"] = root.name
        # Requests the SDK would never send.
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        no_version = (await h.post(f"{url}/a2a/agent", json=rpc)).json()
        unknown = (await h.post(f"{url}/a2a/agent", json={**rpc, "method": "Nope"},
                                headers={"A2A-Version": "1.0"})).json()
        not_json = (await h.post(f"{url}/a2a/agent", content=b"{",
                                 headers={"A2A-Version": "1.0",
                                          "Content-Type": "application/json"})).json()
        # The card says extendedAgentCard: false (spec 3.3.4).
        extended = (await h.post(f"{url}/a2a/agent", json={**rpc, "method": "GetExtendedAgentCard",
                                                          "params": {}},
                                 headers={"A2A-Version": "1.0"})).json()
        out["bad"] = {"no_version": no_version["error"]["code"],
                      "unknown": unknown["error"]["code"],
                      "not_json": not_json["error"]["code"],
                      "extended_card": extended["error"]["code"]}
    async with httpx.AsyncClient() as anonymous:
        # The card is public; a call is not.
        out["no_key_card"] = (await anonymous.get(
            f"{url}/a2a/agent/.well-known/agent-card.json")).status_code
        out["no_key_call"] = (await anonymous.post(
            f"{url}/a2a/agent", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks"},
            headers={"A2A-Version": "1.0"})).status_code

    # A blocking send: the task once it has ended.
    blocking = await client(key)
    [first] = await send(blocking, user("hello there"))
    task = first.task
    out["send"] = {"state": state(task), "texts": texts(task.artifacts),
                   "context": task.context_id, "history": len(task.history)}
    context = task.context_id

    # A streamed send in the same context: the task, then its updates.
    streaming = await client(key, streaming=True)
    events = await send(streaming, user("and again", context=context))
    kinds = [e.WhichOneof("payload") for e in events]
    finals = [TaskState.Name(e.status_update.status.state) for e in events
              if e.HasField("status_update")]
    streamed_texts = [p.text for e in events if e.HasField("artifact_update")
                      for p in e.artifact_update.artifact.parts]
    out["stream"] = {"kinds": kinds, "last_state": finals[-1] if finals else None,
                     "texts": streamed_texts, "context": events[0].task.context_id}
    second = events[0].task.id

    got = await blocking.get_task(GetTaskRequest(id=second))
    out["get"] = {"state": state(got), "texts": texts(got.artifacts)}
    listed = await blocking.list_tasks(ListTasksRequest(context_id=context))
    out["list"] = {"ids": [t.id for t in listed.tasks], "total": listed.total_size}
    out["second_first"] = listed.tasks[0].id == second if listed.tasks else False

    # A task waiting on approval: INPUT_REQUIRED with the call, a push
    # config, then a decision that lets it finish.
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
    [asked] = await send(blocking, user("$ echo approved"),
                         {"options": {"permissions": {"mode": "ask"}}})
    waiting = asked.task
    data = [MessageToDict(p.data) for p in waiting.status.message.parts if p.HasField("data")]
    out["approval"] = {"state": state(waiting), "tool": data[0].get("tool") if data else None}
    made = await blocking.create_task_push_notification_config(
        TaskPushNotificationConfig(task_id=waiting.id, url=hook, token="tok-1"))
    listed_configs = await blocking.list_task_push_notification_configs(
        ListTaskPushNotificationConfigsRequest(task_id=waiting.id))
    out["push_configs"] = [c.url for c in listed_configs.configs]
    out["push_refused"] = await error_of(blocking.create_task_push_notification_config(
        TaskPushNotificationConfig(task_id=waiting.id, url="http://169.254.169.254/latest")))
    decision = new_message([new_data_part({"decision": "allow"})],
                           context_id=waiting.context_id, task_id=waiting.id,
                           role=Role.ROLE_USER)
    [decided] = await send(blocking, decision)
    out["decided"] = {"state": state(decided.task), "same": decided.task.id == waiting.id,
                      "made": made.id != ""}
    out["push_done"] = await asyncio.to_thread(Receiver.done.wait, 30)
    out["push"] = Receiver.got
    server.shutdown()

    # A long task: sent to return at once, subscribed to, then cancelled.
    polling = await client(key, polling=True)
    [started] = await send(polling, user("count " * 400))
    long_id = started.task.id
    out["at_once"] = state(started.task)
    subscriber = await client(key, streaming=True)
    seen = []

    async def follow():
        async for event in subscriber.subscribe(SubscribeToTaskRequest(id=long_id)):
            seen.append(event)
            if len(seen) == 1:
                subscribed.set()

    subscribed = asyncio.Event()
    following = asyncio.create_task(follow())
    await asyncio.wait_for(subscribed.wait(), 30)
    cancelled = await blocking.cancel_task(CancelTaskRequest(id=long_id))
    await asyncio.wait_for(following, 30)
    out["cancel"] = {"state": state(cancelled),
                     "first": seen[0].WhichOneof("payload"),
                     "last": TaskState.Name(seen[-1].status_update.status.state)
                     if seen[-1].HasField("status_update") else None}
    out["cancel_again"] = await error_of(blocking.cancel_task(CancelTaskRequest(id=long_id)))
    out["subscribe_ended"] = await error_of(
        anext(aiter(subscriber.subscribe(SubscribeToTaskRequest(id=long_id)))))
    out["not_cancelable"] = TaskNotCancelableError.__name__
    out["unsupported"] = UnsupportedOperationError.__name__

    # Another key sees none of it.
    other = await client(other_key)
    other_stream = await client(other_key, streaming=True)
    out["other"] = {
        "get": await error_of(other.get_task(GetTaskRequest(id=second))),
        "cancel": await error_of(other.cancel_task(CancelTaskRequest(id=second))),
        "list": len((await other.list_tasks(ListTasksRequest())).tasks),
        "context": await error_of(send(other, user("intrude", context=context))),
        "subscribe": await error_of(
            anext(aiter(other_stream.subscribe(SubscribeToTaskRequest(id=long_id))))),
    }
    # A context the client names: each key's "shared-name" is its own.
    [mine] = await send(blocking, user("named context", context="shared-name"))
    [theirs] = await send(other, user("also named", context="shared-name"))
    out["named"] = {
        "echoed": [mine.task.context_id, theirs.task.context_id],
        "mine": [t.id for t in (await blocking.list_tasks(
            ListTasksRequest(context_id="shared-name"))).tasks] == [mine.task.id],
        "theirs": [t.id for t in (await other.list_tasks(
            ListTasksRequest(context_id="shared-name"))).tasks] == [theirs.task.id],
    }
    out["not_found"] = TaskNotFoundError.__name__
    print(json.dumps(out))


asyncio.run(main())
