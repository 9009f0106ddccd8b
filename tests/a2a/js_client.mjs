// Drives Conclave's A2A server with the official JavaScript SDK
// (@a2a-js/sdk): the card, a streamed send, a follow-up in the same
// context, GetTask. Usage: node js_client.mjs PREFIX URL KEY, PREFIX the
// npm prefix the SDK is installed under. Prints one JSON object of what it
// saw.
import { createRequire } from "node:module";
import { randomUUID } from "node:crypto";

const [prefix, url, key] = process.argv.slice(2);
const require = createRequire(`${prefix}/node_modules/`);
const sdk = require("@a2a-js/sdk/client");
const { Role, TaskState } = require("@a2a-js/sdk");

const authed = (input, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set("Authorization", `Bearer ${key}`);
  return fetch(input, { ...init, headers });
};
const options = sdk.ClientFactoryOptions.createFrom(sdk.ClientFactoryOptions.default, {
  transports: [new sdk.JsonRpcTransportFactory({ fetchImpl: authed })],
  cardResolver: new sdk.DefaultAgentCardResolver({ fetchImpl: authed }),
});
const client = await new sdk.ClientFactory(options).createFromUrl(`${url}/a2a/agent/`);

const message = (text, contextId = "") => ({
  message: {
    messageId: randomUUID(), contextId, taskId: "", role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value: text } }],
    metadata: undefined, extensions: [], referenceTaskIds: [],
  },
  tenant: "", configuration: undefined, metadata: undefined,
});

const out = { kinds: [], states: [], texts: [] };
let taskId = "";
let contextId = "";
for await (const event of client.sendMessageStream(message("hello from js"))) {
  const payload = event.payload;
  out.kinds.push(payload.$case);
  if (payload.$case === "task") {
    taskId = payload.value.id;
    contextId = payload.value.contextId;
  } else if (payload.$case === "statusUpdate") {
    out.states.push(TaskState[payload.value.status.state]);
  } else if (payload.$case === "artifactUpdate") {
    for (const part of payload.value.artifact.parts) {
      if (part.content?.$case === "text") out.texts.push(part.content.value);
    }
  }
}
const again = await client.sendMessage(message("and from js again", contextId));
const task = again.$case === "task" ? again.value : again.payload?.value ?? again;
out.again = { state: TaskState[task.status.state], context: task.contextId === contextId };
const got = await client.getTask({ tenant: "", id: taskId, historyLength: undefined });
out.got = TaskState[got.status.state];
console.log(JSON.stringify(out));
