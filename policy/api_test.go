package policy

import "testing"

// TestCallOfIsTheOneListOfAPIPaths: the API, whether it is an inference
// call (replayed freely) and its operation name come from one table.
func TestCallOfIsTheOneListOfAPIPaths(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		path string
		want Call
	}{
		{"/v1/chat/completions", Call{APIChat, true, "chat"}},
		{"/v1/chat/completions/", Call{APIChat, true, "chat"}},
		{"/v1/completions", Call{APICompletions, true, "text_completion"}},
		{"/v1/responses", Call{APIResponses, true, "chat"}},
		{"/v1/embeddings", Call{APIOther, true, "embeddings"}},
		{"/api/embeddings", Call{APIOther, true, "embeddings"}},
		{"/api/embed", Call{APIOther, true, "embeddings"}},
		{"/v1/moderations", Call{APIOther, true, ""}},
		{"/api/chat", Call{APIOllama, true, "chat"}},
		{"/api/generate", Call{APIOllama, true, "text_completion"}},
		{"/v1/messages", Call{APIAnthropic, true, "chat"}},
		{"/anthropic/v1/messages", Call{APIAnthropic, true, "chat"}},
		{"/v1/messages/count_tokens", Call{APIAnthropic, true, ""}},
		{"/v1/messages/batches", Call{}},
		{"/v1/threads/t1/messages", Call{}},
		{"/v1/files", Call{}},
		{"/v1/chat/completions/x", Call{}},
		{"/", Call{}},
	} {
		if got := CallOf([]byte(tt.path)); got != tt.want {
			t.Errorf("CallOf(%q) = %+v, want %+v", tt.path, got, tt.want)
		}
		if got, want := Replayable([]byte("POST"), []byte(tt.path), false), tt.want.Inference; got != want {
			t.Errorf("Replayable(POST %q) = %v, want %v", tt.path, got, want)
		}
		if got := APIOf([]byte(tt.path)); got != tt.want.API {
			t.Errorf("APIOf(%q) = %v, want %v", tt.path, got, tt.want.API)
		}
	}
}
