package policy

import "bytes"

// API is the API a request speaks, told from its path: where a streamed
// reply's commit point is, whether sending it twice is safe, and what a
// trace calls it.
type API uint8

// The APIs Sturdy knows by path.
const (
	// APIOther: committed at the first body byte.
	APIOther API = iota
	// APIChat: OpenAI chat completions SSE (…/chat/completions).
	APIChat
	// APICompletions: legacy completions SSE (…/completions).
	APICompletions
	// APIResponses: the Responses API SSE (…/responses).
	APIResponses
	// APIOllama: Ollama's NDJSON (/api/chat, /api/generate).
	APIOllama
	// APIAnthropic: Anthropic's Messages API SSE (…/v1/messages, and its
	// …/v1/messages/count_tokens).
	APIAnthropic
)

// Call is what a request's path says of it: its API, whether it only
// computes (an inference call: sending it twice costs tokens but changes
// no state), and its gen_ai.operation.name ("": not a GenAI call).
type Call struct {
	API       API
	Inference bool
	Operation string
}

// Charged reports whether the call spends tokens a token budget counts:
// an inference call with an operation (chat, completions, embeddings) —
// not a count_tokens, a moderation, a model list or a write.
func (c Call) Charged() bool { return c.Inference && c.Operation != "" }

// calls are the path endings Sturdy knows, the longest of a shared tail
// first (…/chat/completions before …/completions). Ollama's legacy
// /api/embeddings ends in /embeddings. Anthropic's are matched with their
// /v1, so that another API's …/messages (OpenAI's thread messages, a
// write) is not taken for them; …/v1/messages/batches is a write.
var calls = []struct {
	suffix []byte
	call   Call
}{
	{[]byte("/chat/completions"), Call{APIChat, true, "chat"}},
	{[]byte("/completions"), Call{APICompletions, true, "text_completion"}},
	{[]byte("/responses"), Call{APIResponses, true, "chat"}},
	{[]byte("/embeddings"), Call{APIOther, true, "embeddings"}},
	{[]byte("/moderations"), Call{APIOther, true, ""}},
	{[]byte("/api/chat"), Call{APIOllama, true, "chat"}},
	{[]byte("/api/generate"), Call{APIOllama, true, "text_completion"}},
	{[]byte("/api/embed"), Call{APIOther, true, "embeddings"}},
	{[]byte("/v1/messages"), Call{APIAnthropic, true, "chat"}},
	{[]byte("/v1/messages/count_tokens"), Call{APIAnthropic, true, ""}},
}

// CallOf tells what a request's path (without query; one trailing slash
// is ignored) calls.
func CallOf(path []byte) Call {
	if n := len(path); n > 1 && path[n-1] == '/' {
		path = path[:n-1]
	}
	for _, c := range calls {
		if bytes.HasSuffix(path, c.suffix) {
			return c.call
		}
	}
	return Call{}
}

// APIOf tells a request's streaming API from its path (without query).
func APIOf(path []byte) API { return CallOf(path).API }

// Replayable reports whether a request is safe to send again after the
// upstream may have seen it: GET, HEAD and OPTIONS, any request carrying an
// Idempotency-Key, and POSTs to inference calls (CallOf). Other writes
// (files, batches, fine-tuning …) are not: they are retried only when the
// request provably never left.
func Replayable(method, path []byte, hasIdempotencyKey bool) bool {
	return CallOf(path).Replayable(method, hasIdempotencyKey)
}

// Replayable is Replayable for a request of method to c's path (its
// CallOf read once, by the caller).
func (c Call) Replayable(method []byte, hasIdempotencyKey bool) bool {
	if hasIdempotencyKey {
		return true
	}
	switch string(method) {
	case "GET", "HEAD", "OPTIONS":
		return true
	case "POST":
		return c.Inference
	}
	return false
}
