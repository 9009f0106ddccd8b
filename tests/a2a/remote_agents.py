"""Two A2A 1.0 agents made with the official a2a-sdk, served on 127.0.0.1
for tests/a2a_client.rs.

- /echo: streams a working status, the echo as an artifact in two chunks,
  and completes; the artifact counts the messages of its context, so a
  client that keeps the contextId sees the count grow.
- /slow: says it started, then works until it is cancelled.
- /plain: the echo agent with a card that says it does not stream.

Prints `listening http://127.0.0.1:PORT` once serving, then one line
`cancelled TASK_ID` for every task CancelTask reaches, and `context ID`
for every message the echo agent gets (then `authorization VALUE` when
the request had that header).

Needs a2a-sdk[http-server] and uvicorn (which the mcp package brings).
"""

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
)


def say(line: str) -> None:
    print(line, flush=True)


async def updater_for(context: RequestContext, queue: EventQueue) -> TaskUpdater:
    task = context.current_task
    if task is None:
        task = new_task_from_user_message(context.message)
        await queue.enqueue_event(task)
    return TaskUpdater(queue, task.id, task.context_id)


class Echo(AgentExecutor):
    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        updater = await updater_for(context, queue)
        text = context.get_user_input()
        count = self.seen.get(updater.context_id, 0) + 1
        self.seen[updater.context_id] = count
        say(f"context {updater.context_id}")
        headers = context.call_context.state.get("headers", {})
        if "authorization" in headers:
            say(f"authorization {headers['authorization']}")
        await updater.start_work(
            new_text_message(f"echoing {text!r}", role=Role.ROLE_AGENT)
        )
        await updater.add_artifact(
            [new_text_part(f"echo #{count}: ")], artifact_id="echo", name="echo"
        )
        await updater.add_artifact(
            [new_text_part(text.upper())], artifact_id="echo", append=True, last_chunk=True
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        raise NotImplementedError


class Slow(AgentExecutor):
    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        updater = await updater_for(context, queue)
        await updater.start_work(new_text_message("slow work started", role=Role.ROLE_AGENT))
        # Works until the SDK cancels this coroutine on CancelTask.
        await asyncio.Event().wait()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        say(f"cancelled {context.task_id}")
        updater = TaskUpdater(queue, context.task_id, context.context_id)
        await updater.cancel()


def card(base: str, name: str, description: str, streaming: bool) -> AgentCard:
    return AgentCard(
        name=name,
        description=description,
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=f"{base}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id=f"{name}-skill",
                name=f"{name} skill",
                description=f"What {name} does best",
                tags=["test"],
            )
        ],
    )


def app_for(base: str, name: str, executor: AgentExecutor, streaming: bool) -> Starlette:
    agent_card = card(base, name, f"The {name} agent of the tests.", streaming)
    handler = DefaultRequestHandlerV2(
        agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=agent_card
    )
    routes = create_agent_card_routes(agent_card) + create_jsonrpc_routes(handler, "/")
    return Starlette(routes=routes)


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    root = f"http://127.0.0.1:{port}"
    app = Starlette(
        routes=[
            Mount("/echo", app=app_for(f"{root}/echo", "echo", Echo(), True)),
            Mount("/slow", app=app_for(f"{root}/slow", "slow", Slow(), True)),
            Mount("/plain", app=app_for(f"{root}/plain", "plain", Echo(), False)),
        ]
    )
    config = uvicorn.Config(app, log_level="warning")
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        say(f"listening {root}")
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
