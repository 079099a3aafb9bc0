// The openai npm SDK's Responses stream helper through Sturdy:
// client.responses.stream(...).finalResponse(), which puts each delta into
// the output item and content part the stream announced. Prints the final
// response's text, or "ERROR <message>" if the SDK raised.
// Usage: node responses_final.mjs <sturdy base URL>
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "sk-e2e", maxRetries: 0 });
try {
  const stream = client.responses.stream({ model: "demo", input: "hi" });
  let deltas = "";
  stream.on("response.output_text.delta", (event) => { deltas += event.delta; });
  const final = await stream.finalResponse();
  console.log("DELTAS " + deltas);
  const text = final.output.flatMap((item) => item.content ?? []).map((part) => part.text ?? "").join("");
  console.log("TEXT " + text);
} catch (err) {
  console.log("ERROR " + err.message);
}
