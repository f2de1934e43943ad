// An independent ACP client for tests/acp/test_typescript_sdk.py, written with the official TypeScript SDK
// (@agentclientprotocol/sdk, stable v1): it runs `codesdk acp` (the command line after `--`) twice and prints what
// it saw as one JSON object. First connection: a new session, a prompt whose two writes are allowed once, then
// rejected; a prompt cancelled mid-turn; the session list. Second connection: the session loaded.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const [cwd, ...rest] = process.argv.slice(2);
const command = rest.slice(rest.indexOf("--") + 1);

function recorder(answers) {
  const seen = { updates: [], asked: [], chunk: null };
  let wake = () => {};
  seen.nextChunk = () => new Promise((resolve) => { wake = resolve; });
  const app = acp.client()
    .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
      seen.asked.push({ toolCallId: params.toolCall.toolCallId, kinds: params.options.map((o) => o.kind) });
      const optionId = answers.shift();
      return optionId ? { outcome: { outcome: "selected", optionId } } : { outcome: { outcome: "cancelled" } };
    })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      seen.updates.push(params.update);
      if (params.update.sessionUpdate === "agent_message_chunk") wake();
    });
  return { app, seen };
}

function summary(updates) {
  const states = {};
  let text = "";
  const prompts = [];
  for (const u of updates) {
    if ((u.sessionUpdate === "tool_call" || u.sessionUpdate === "tool_call_update") && u.status) states[u.toolCallId] = u.status;
    if (u.sessionUpdate === "agent_message_chunk") text += u.content.text;
    if (u.sessionUpdate === "user_message_chunk") prompts.push(u.content.text);
  }
  return { states, text, prompts };
}

async function connect(app, op) {
  const child = spawn(command[0], command.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  try {
    return await app.connectWith(stream, op);
  } finally {
    child.stdin.end();
    const code = await exited;
    if (code !== 0) throw new Error(`codesdk acp exited ${code}`);
  }
}

const first = recorder(["allow_once", "reject_once"]);
const live = await connect(first.app, async (agent) => {
  const init = await agent.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
  const created = await agent.request(acp.methods.agent.session.new, {
    cwd, mcpServers: [], _meta: { codesdk: { runtimeConfig: { scenario: "write-twice" } } },
  });
  const sessionId = created.sessionId;
  const done = await agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: "write both" }] });
  const chunk = first.seen.nextChunk();
  const hanging = agent.request(acp.methods.agent.session.prompt, {
    sessionId, prompt: [{ type: "text", text: "think" }], _meta: { codesdk: { runtimeConfig: { scenario: "hang" } } },
  });
  await chunk;
  await agent.notify(acp.methods.agent.session.cancel, { sessionId });
  const cancelled = await hanging;
  const listed = await agent.request(acp.methods.agent.session.list, {});
  return {
    protocolVersion: init.protocolVersion, sessionId, workspace: created._meta.codesdk.workspace,
    stopReasons: [done.stopReason, cancelled.stopReason], receipt: Boolean(cancelled._meta?.codesdk?.receipt),
    listed: listed.sessions.map((s) => s.sessionId), asked: first.seen.asked, ...summary(first.seen.updates),
  };
});

const second = recorder([]);
const loaded = await connect(second.app, async (agent) => {
  await agent.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
  const answer = await agent.request(acp.methods.agent.session.load, { sessionId: live.sessionId, cwd, mcpServers: [] });
  return { lastSeq: answer._meta.codesdk.lastSeq, ...summary(second.seen.updates) };
});

process.stdout.write(JSON.stringify({ live, loaded }) + "\n");
