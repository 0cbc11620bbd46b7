package sim_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/llmq/llmq/internal/sim"
)

// A simulator with a 2 RPM model, called in memory: the third request in
// the minute is refused with the OpenAI-compatible limit_requests error.
func Example() {
	s, err := sim.New(sim.Config{
		Headers: sim.HeaderConfig{RetryAfter: true},
		Models:  map[string]sim.ModelConfig{"qwen-plus": {RPM: 2}},
	})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	client := &http.Client{Transport: s.Transport()}
	body := `{"model":"qwen-plus","messages":[{"role":"user","content":"Hello"}]}`
	for range 3 {
		resp, err := client.Post("http://llmsim/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Println(resp.StatusCode, strings.Contains(string(b), sim.ExpectedContent([]byte(body))), "retry_after="+resp.Header.Get("Retry-After"))
	}
	// Raise the limit at run time (as PUT /admin/models/qwen-plus does).
	if err := s.SetModel("qwen-plus", sim.ModelConfig{RPM: 3}); err != nil {
		panic(err)
	}
	resp, _ := client.Post("http://llmsim/v1/chat/completions", "application/json", strings.NewReader(body))
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode, s.Stats().Models["qwen-plus"].Admitted)
	// Output:
	// 200 true retry_after=
	// 200 true retry_after=
	// 429 false retry_after=60
	// 200 3
}
