package ratecontrol

import "testing"

// A search asked for adds its results to the prompt; n adds nothing to it.
func TestEstimateTokensCountsSearch(t *testing.T) {
	base := `{"messages":[{"role":"user","content":"hello there"}]`
	plain := EstimateTokens([]byte(base + `}`))
	for _, tc := range []struct {
		body string
		want int
	}{
		{base + `,"enable_search":true}`, plain + estimateSearch},
		{base + `,"web_search_options":{}}`, plain + estimateSearch},
		{base + `,"enable_search":true,"web_search_options":{}}`, plain + estimateSearch},
		{base + `,"enable_search":false}`, plain},
		{base + `,"web_search_options":null}`, plain},
		{base + `,"n":4}`, plain},
	} {
		if got := EstimateTokens([]byte(tc.body)); got != tc.want {
			t.Errorf("EstimateTokens(%s) = %d, want %d", tc.body, got, tc.want)
		}
	}
}
