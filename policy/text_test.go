package policy

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestTextBytes(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", 100_000) + `"abc"` + strings.Repeat("]", 100_000)
	deepObj := strings.Repeat(`{"content":`, 50_000) + `"abc"` + strings.Repeat("}", 50_000)
	atLimit := strings.Repeat("[", MaxTextDepth) + `"abc"` + strings.Repeat("]", MaxTextDepth)
	pastLimit := strings.Repeat("[", MaxTextDepth+1) + `"abc"` + strings.Repeat("]", MaxTextDepth+1)
	for _, tt := range []struct {
		name string
		raw  string
		want int
	}{
		{"a string: its bytes", `"héllo"`, 6},
		{"escapes: what they stand for, \\u three", `"a\nb\u00e9\"c"`, 8},
		{"a CJK character: three bytes", `"héllo 日本"`, 13},
		{"a value ends the walk", `"ab" "cd"`, 2},
		{"strings of an array", `["ab","cd"]`, 4},
		{"an object's text and content only", `{"role":"user","content":"hi","name":"xyz","text":"abc"}`, 5},
		{"parts", `[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"x"}}]`, 3},
		{"nested content", `[{"content":[{"text":"ab"},{"content":"cd"}]}]`, 4},
		{"values of other keys are not text", `{"tool":{"text":"no"},"content":"yes"}`, 3},
		{"an escaped key is read as a parser reads it", `{"te\u0078t":"abc"}`, 3},
		{"numbers and literals", `[1, true, null, {"text": 2}]`, 0},
		{"malformed: an unended string", `["abc`, 3},
		{"malformed: stray closers", `]]}"ab"`, 2},
		{"at the depth limit: followed", atLimit, 3},
		{"past the depth limit: its bytes", pastLimit, len(pastLimit) - 2*MaxTextDepth},
		{"100,000 nested arrays: linear, its bytes", deep, len(deep) - 2*MaxTextDepth},
		{"50,000 nested objects: linear, its bytes", deepObj, len(deepObj) - (len(`{"content":`)+1)*MaxTextDepth},
	} {
		if got := TextBytes(tt.raw); got != tt.want {
			t.Errorf("%s: %d bytes, want %d", tt.name, got, tt.want)
		}
	}
}

// textOfByGjson is the recursive count TextBytes replaced, kept as the
// reference its fuzz test compares against: right, but O(depth²).
func textOfByGjson(v gjson.Result) int {
	switch {
	case v.Type == gjson.String:
		return len(v.Str)
	case v.IsArray():
		n := 0
		v.ForEach(func(_, e gjson.Result) bool { n += textOfByGjson(e); return true })
		return n
	case v.IsObject():
		return textOfByGjson(v.Get("text")) + textOfByGjson(v.Get("content"))
	}
	return 0
}

// FuzzTextBytes: on valid JSON within the depth limit TextBytes counts at
// least what the recursive walk counts (more only for duplicate keys and
// surrogate pairs, whose escapes it counts one each), and it never panics.
// Both count a string's text in UTF-8 bytes.
func FuzzTextBytes(f *testing.F) {
	for _, s := range []string{`"héllo"`, `["ab",{"text":"cd","content":[{"text":"e"}]}]`, `{"te\u0078t":"abc"}`, `[[["a"]]]`, `{"a":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got := TextBytes(raw)
		if !gjson.Valid(raw) || strings.Count(raw, "[")+strings.Count(raw, "{") > MaxTextDepth {
			return
		}
		if ref := textOfByGjson(gjson.Parse(raw)); got < ref {
			t.Fatalf("TextBytes(%q) = %d, the recursive walk counts %d", raw, got, ref)
		}
	})
}

// BenchmarkRequestTokens reads a 200 KB agent body: a conversation of
// tool calls and results.
func BenchmarkRequestTokens(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","max_tokens":512,"messages":[{"role":"system","content":"` + strings.Repeat("You are helpful. ", 200) + `"}`)
	for sb.Len() < 200<<10 {
		sb.WriteString(`,{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a.go\"}"}}]}`)
		sb.WriteString(`,{"role":"tool","tool_call_id":"c1","content":"` + strings.Repeat("package main; func x() {} ", 40) + `"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		RequestTokens(APIChat, body)
	}
}

func TestFields(t *testing.T) {
	t.Parallel()
	var got []string
	Fields(` { "a" : 1 , "b":{"x":[1,"}"]}, "c":"d\"e" ,"e":null}`, func(key string, i int) int {
		got = append(got, key)
		return valueEnd(` { "a" : 1 , "b":{"x":[1,"}"]}, "c":"d\"e" ,"e":null}`, i)
	})
	if strings.Join(got, ",") != "a,b,c,e" {
		t.Fatalf("keys %v", got)
	}
	for _, bad := range []string{``, `[]`, `{`, `{"a"`, `{"a":`, `{"a":1,`, `{"a" 1}`, `{1:2}`} {
		Fields(bad, func(string, int) int { return 0 }) // ends, never panics
	}
}

// FuzzRequestTokens: any body is read without a panic, and a valid one's
// max output is gjson's reading of the first key set.
func FuzzRequestTokens(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50}`)
	f.Add(`{"max_completion_tokens":7,"max_tokens":9,"options":{"num_predict":3}}`)
	f.Fuzz(func(t *testing.T, body string) {
		_, got := RequestTokens(APIChat, []byte(body))
		if !gjson.Valid(body) || !gjson.Parse(body).IsObject() {
			return
		}
		want := int64(0)
		for _, key := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens", "options.num_predict"} {
			if v := gjson.Get(body, key); v.Type == gjson.Number && v.Int() > 0 {
				want = v.Int()
				break
			}
		}
		if got != want && !strings.Contains(body, `\`) && strings.Count(body, "max") <= 1 && strings.Count(body, "options") <= 1 {
			t.Fatalf("RequestTokens(%q) max %d, gjson reads %d", body, got, want)
		}
	})
}
