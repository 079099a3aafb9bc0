// A Responses API stream through Sturdy with the official openai npm SDK:
// prints the text streamed, then "ERROR <message>" if the SDK raised.
// Usage: node responses_stream.mjs <sturdy base URL>
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "sk-e2e", maxRetries: 0 });
let text = "";
try {
  const stream = await client.responses.create({ model: "m", input: "hi", stream: true });
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") text += event.delta;
  }
  console.log("TEXT " + text);
} catch (err) {
  console.log("TEXT " + text);
  console.log("ERROR " + err.message);
}
