"""The client of benches/routing.sh: SESSIONS agent conversations at once,
each TURNS turns long, through one router.

Every conversation opens with the same system prompt of SYSTEM_WORDS words;
each turn adds a user message of USER_WORDS words of its own, asks for a
streamed completion (with the conversation's id in `X-Session-ID`, which
session-affine strategies read) and appends the answer, so the prompt grows
turn by turn as an agent's does. Time to first token is measured from
sending the request to the first content delta.

usage: routing_client.py URL [SESSIONS TURNS SYSTEM_WORDS USER_WORDS]
Prints one JSON line: the TTFTs in milliseconds, and the calls that failed.
"""

import asyncio
import json
import sys
import time

import httpx


async def conversation(url, session, turns, system, user_words, ttfts):
    # A client (one connection) per conversation: httpcore's pool scans
    # all its connections for every request, which at 64 costs more CPU
    # than everything else here. Plain HTTP: no certificates to load.
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), verify=False) as client:
        await turns_of(client, url, session, turns, system, user_words, ttfts)


async def turns_of(client, url, session, turns, system, user_words, ttfts):
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        words = " ".join(f"s{session}t{turn}w{i}" for i in range(user_words))
        messages.append({"role": "user", "content": words})
        body = {"model": "sim-model", "messages": messages, "stream": True}
        headers = {"X-Session-ID": f"session-{session}"}
        sent = time.perf_counter()
        first = None
        answer = []
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                raise RuntimeError(f"{response.status_code}: {text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                for choice in chunk.get("choices", []):
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if first is None:
                            first = time.perf_counter()
                        answer.append(content)
        if first is None:
            raise RuntimeError("a stream without content")
        ttfts.append((first - sent) * 1000.0)
        messages.append({"role": "assistant", "content": "".join(answer)})


async def main():
    url = sys.argv[1]
    sessions, turns, system_words, user_words = (
        int(a) for a in (sys.argv[2:6] or (64, 8, 2000, 150))
    )
    system = " ".join(f"rule{i}" for i in range(system_words))
    ttfts = []
    started = time.perf_counter()
    results = await asyncio.gather(
        *(
            conversation(url, s, turns, system, user_words, ttfts)
            for s in range(sessions)
        ),
        return_exceptions=True,
    )
    elapsed = time.perf_counter() - started
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    print(json.dumps({"ttft_ms": ttfts, "failed": failed, "elapsed_s": elapsed}))


asyncio.run(main())
