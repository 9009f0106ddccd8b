// Drives Conclave's AG-UI endpoint with the official JavaScript client,
// `@ag-ui/client`'s HttpAgent, which checks the order of the events it
// receives (a run that breaks the protocol rejects). Two runs on one
// thread, then a new agent on the thread (a page opened again) runs
// with no message and gets the thread's MESSAGES_SNAPSHOT.
// Prints one JSON object. Usage: node http_agent.mjs CLIENT_DIR URL KEY
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";

const [clientDir, url, key] = process.argv.slice(2);
const require = createRequire(`${clientDir}/`);
const { HttpAgent } = require("@ag-ui/client");

const agent = new HttpAgent({
  url: `${url}/ag-ui/agent`,
  headers: { authorization: `Bearer ${key}` },
  threadId: randomUUID(),
});
const runs = [];
for (const prompt of ["hello from javascript", "once more"]) {
  const seen = [];
  agent.addMessage({ id: randomUUID(), role: "user", content: prompt });
  const result = await agent.runAgent(
    { runId: randomUUID(), forwardedProps: { text_deltas: true } },
    { onEvent: ({ event }) => { seen.push(event.type); } },
  );
  runs.push({ types: seen, result: result.result, newMessages: result.newMessages });
}
const again = new HttpAgent({
  url: `${url}/ag-ui/agent`,
  headers: { authorization: `Bearer ${key}` },
  threadId: agent.threadId,
});
const types = [];
await again.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => { types.push(event.type); } });
console.log(JSON.stringify({
  runs, messages: agent.messages, reconnect: { types, messages: again.messages },
}));
