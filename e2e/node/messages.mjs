// Anthropic's npm SDK (@anthropic-ai/sdk) through Sturdy: a message
// created, then streamed (finalMessage assembles the events). Prints
// "CREATED <text>", "STREAMED <text>", or "ERROR <status> <type> <message>"
// where the SDK raised. Usage: node messages.mjs <sturdy base URL> [create|stream]
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.argv[2], apiKey: "sk-ant-e2e", maxRetries: 2 });
const params = { model: "claude-e2e", max_tokens: 64, messages: [{ role: "user", content: "hi" }] };
const text = (m) => m.content.map((b) => b.text ?? "").join("");
const which = process.argv[3] ?? "both";
try {
  if (which !== "stream") console.log("CREATED " + text(await client.messages.create(params)));
  if (which !== "create") console.log("STREAMED " + text(await client.messages.stream(params).finalMessage()));
} catch (err) {
  console.log("ERROR " + (err.status ?? "-") + " " + (err.error?.error?.type ?? err.type ?? "-") + " " + err.message);
}
