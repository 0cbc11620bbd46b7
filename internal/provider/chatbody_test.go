package provider

import (
	"testing"
)

// A DashScope compatible-mode answer as it comes back, with fields the
// reader does not keep.
const typicalChatBody = `{"id":"chatcmpl-3b1d","object":"chat.completion","created":1796632085,"model":"qwen-plus",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"The ticket is about billing: \"refund\" requested.\n"},` +
	`"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":244,"completion_tokens":17,"total_tokens":261,` +
	`"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":null}`

func TestChatBodyWalkReadsTheCommonBody(t *testing.T) {
	b, ok := scanChatBody([]byte(typicalChatBody))
	if !ok {
		t.Fatal("the walk left the common body to the decoder")
	}
	want := chatBody{content: "The ticket is about billing: \"refund\" requested.\n", prompt: 244, completion: 17, hasUsage: true, hasChoices: true}
	if b != want {
		t.Fatalf("read %+v, want %+v", b, want)
	}
}

// oddChatBodies are bodies where the decoder has a reading of its own, or
// none: the walk must answer as it does (or leave the answer to it).
var oddChatBodies = []string{
	typicalChatBody,
	`{"choices":[{"message":{"content":"a"}},{"message":{"content":"b"}}]}`,
	`{"choices":[]}`,
	`{"choices":null}`,
	`{"choices":[null]}`,
	`{"choices":[{"message":null}]}`,
	`{"choices":[{"message":{"content":null}}]}`,
	`{"choices":[{}]}`,
	`{"choices":[{"message":{"content":["part"]}}]}`,
	`{"choices":[{"message":{"content":"a"}},{"message":{"content":7}}]}`,
	`{"choices":[{"message":{"content":"a"}},5]}`,
	`{"Choices":[{"message":{"content":"a"}}]}`,
	`{"choices":[{"Message":{"content":"a"}}]}`,
	`{"choices":[{"message":{"CONTENT":"a"}}]}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"Prompt_Tokens":3}}`,
	`{"choices":5,"choices":[{"message":{"content":"a"}}]}`,
	`{"choices":[{"message":{"content":"a"}}],"choices":[{"message":{"content":"b"}}]}`,
	`{"choices":[{"message":{"content":"a","content":"b"}}]}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":null}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":null,"completion_tokens":2}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":1.5}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":1e2}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":-4}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":"4"}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"total_tokens":99999999999999999999}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":9223372036854775807}}`,
	`{"choices":[{"message":{"content":"a"}}],"usage":[1]}`,
	`{"choices":[{"message":{"content":"\u00e9\ud83d\ude00 \\ \/"}}]}`,
	"{\"choices\":[{\"message\":{\"content\":\"bad \xff utf8\"}}]}",
	`{"choices":[{"message":{"content":"a"}}]`,
	`{"choices":[{"message":{"content":"a"}}]} x`,
	` {"choices" : [ { "message" : { "content" : "spaced" } } ] , "usage" : { "prompt_tokens" : 1 } } `,
	`null`,
	`[]`,
	`"choices"`,
	``,
}

func TestChatBodyAgreesWithDecoderOnOddBodies(t *testing.T) {
	for _, body := range oddChatBodies {
		got, gotOK := readChatBody([]byte(body))
		want, wantOK := decodeChatBody([]byte(body))
		if gotOK != wantOK || got != want {
			t.Errorf("%q: read %+v (%v), the decoder %+v (%v)", body, got, gotOK, want, wantOK)
		}
	}
}

// The walk, where it answers, answers as the decoder does.
func FuzzChatBodyAgreesWithDecoder(f *testing.F) {
	for _, body := range oddChatBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := scanChatBody(data)
		if !ok {
			return
		}
		want, wantOK := decodeChatBody(data)
		if !wantOK || got != want {
			t.Fatalf("%q: walked %+v, the decoder %+v (%v)", data, got, want, wantOK)
		}
	})
}

func BenchmarkChatBody(b *testing.B) {
	data := []byte(typicalChatBody)
	b.Run("walk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := scanChatBody(data); !ok {
				b.Fatal("not walked")
			}
		}
	})
	b.Run("decoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeChatBody(data); !ok {
				b.Fatal("not decoded")
			}
		}
	})
}
