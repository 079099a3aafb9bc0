package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"unicode"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"sturdy/upstream"
)

// chatContinuation is a chat completions body with text as a trailing
// assistant message, and vLLM's flags for continuing it when c says so.
func chatContinuation(body, text []byte, c upstream.Continuation) ([]byte, error) {
	msg, _ := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"assistant", string(text)})
	b, err := sjson.SetRawBytes(slices.Clone(body), "messages.-1", msg)
	if err == nil && c == upstream.ContinueVLLM {
		if b, err = sjson.SetBytes(b, "continue_final_message", true); err == nil {
			b, err = sjson.SetBytes(b, "add_generation_prompt", false)
		}
	}
	return b, err
}

// prefillMessages is a Messages API body with text as the answer's
// prefill: appended to a trailing assistant message the request has (a
// string, or its last text block; policy.ContinuableMessages rules out
// any other), else as a new one. Its trailing
// whitespace is stripped — Anthropic refuses a final assistant message
// ending in it — and stripped says how much (the seam drops as much of
// the continuation's leading whitespace). With no text left, the body as
// it is.
func prefillMessages(body, text []byte) (b []byte, stripped int, err error) {
	kept := bytes.TrimRightFunc(text, unicode.IsSpace)
	stripped = len(text) - len(kept)
	if len(kept) == 0 {
		return body, stripped, nil
	}
	n := gjson.GetBytes(body, "messages.#").Int()
	last := gjson.GetBytes(body, fmt.Sprintf("messages.%d", n-1))
	c := last.Get("content")
	switch {
	case n > 0 && last.Get("role").Str == "assistant" && c.Type == gjson.String:
		b, err = sjson.SetBytes(slices.Clone(body), fmt.Sprintf("messages.%d.content", n-1), c.Str+string(kept))
	case n > 0 && last.Get("role").Str == "assistant" && c.Get("@reverse.0.type").Str == "text":
		k := c.Get("#").Int() - 1
		b, err = sjson.SetBytes(slices.Clone(body), fmt.Sprintf("messages.%d.content.%d.text", n-1, k), c.Get("@reverse.0.text").Str+string(kept))
	default:
		msg, _ := json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{"assistant", string(kept)})
		b, err = sjson.SetRawBytes(slices.Clone(body), "messages.-1", msg)
	}
	return b, stripped, err
}
