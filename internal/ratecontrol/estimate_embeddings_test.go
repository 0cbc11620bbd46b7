package ratecontrol

import (
	"context"
	"testing"
)

func TestEstimateEmbeddingTokensCountsTheWholeBatch(t *testing.T) {
	cases := []struct {
		body string
		want int
	}{
		{`{"input":"abcdefgh"}`, 2},
		{`{"input":["abcdefgh","abcd","a"]}`, 2 + 1 + 1},
		{`{"input":[1,2,3,4,5]}`, 5},
		{`{"input":[[1,2,3],[4,5]]}`, 5},
		{`{"input":["你好"]}`, 2},
		{`{"input":""}`, 1},
	}
	for _, c := range cases {
		if got := EstimateEmbeddingTokens([]byte(c.body)); got != c.want {
			t.Errorf("%s: got %d, want %d", c.body, got, c.want)
		}
	}
}

// An input-only model books its input and no expected output, under every
// strategy that books tokens; a chat model books the default output.
func TestInputOnlyBooksNoOutput(t *testing.T) {
	for _, s := range []Strategy{StrategyAuto, StrategyShaping, StrategyAdaptive} {
		lim := Limits{RPM: 6000, TPM: 1e9, Warmup: -1}
		chat := NewGovernor(s, lim)
		emb := NewGovernor(s, lim, WithInputOnly())
		for name, g := range map[string]*Governor{"chat": chat, "embeddings": emb} {
			p, err := g.Acquire(context.Background(), Request{InputTokens: 100})
			if err != nil {
				t.Fatal(err)
			}
			got := p.BookedTokens()
			p.Settle(Result{Class: Classification{Kind: KindOK, Status: 200}, PromptTokens: 100})
			if name == "embeddings" && got != 100 {
				t.Errorf("%s %s: booked %v tokens, want the input's 100", s, name, got)
			}
			if name == "chat" && s != StrategyShaping && got <= 100 { // shaping books input only anyway
				t.Errorf("%s %s: booked %v tokens, want input plus an expected output", s, name, got)
			}
		}
		p, err := emb.Acquire(context.Background(), Request{InputTokens: 40})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.BookedTokens(); got != 40 {
			t.Errorf("%s: after a settled call booked %v, want 40", s, got)
		}
		p.Cancel()
	}
}
