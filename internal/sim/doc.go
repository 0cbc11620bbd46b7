// Package sim owns llmq's provider simulator: an in-process http.Handler
// that speaks the OpenAI-compatible chat-completions API (under /v1 and
// DashScope's /compatible-mode/v1) and enforces a provider's rate limits the
// way Alibaba Model Studio does (docs/design.md#provider-limits). It is
// the yardstick of llmq's tests and benchmarks and the provider of `llmq up`;
// cmd/llmsim serves it on a port.
//
// Rules, per model, each optional:
//   - RPM and RPS: admitted requests over a sliding 60 s / 1 s window, i.e.
//     in (now-window, now]. Request N passes, N+1 gets 429 limit_requests
//     (Throttling.RateQuota) until the oldest request leaves the window.
//   - TPM and TPS: input + output tokens over the same windows, charged when
//     the request is admitted with its actual output size (the simulator
//     knows it); 429 insufficient_quota (Throttling.AllocationQuota). A
//     request whose tokens alone exceed TPM or TPS gets 400.
//   - Burst (growth rate): see BurstConfig; 429 limit_burst_rate
//     (Throttling.BurstRate). Only this 429 honours X-DashScope-Wait-Timeout:
//     the request waits server-side up to that many seconds for the rule to
//     admit it; 0 (or no header) means an immediate 429, and a value at or
//     above the model's max_response_time is ignored.
//
// The windows are exact: each model keeps the admitted requests' times and
// running token totals in a ring and answers every window by binary search.
//
// Input tokens are estimated by InputTokens; output length comes from a
// deterministic OutputMix; the reply content is ExpectedContent(body): JSON
// generated from the schema when response_format asks for it (schema.go).
// Latency (TTFT + tokens × TPT, TPT rising above a capacity of in-flight
// requests) is zero by default. Faults (5xx, hangs, connection resets) are
// drawn from a seeded generator. Stats, GET /admin/stats and GET /metrics
// account admitted traffic per second and act as referee: Overruns counts
// any window in which admitted traffic exceeded a configured limit.
//
// Time comes from a Clock (WithClock); the default, the time package, is
// virtual inside a testing/synctest bubble, so tests need no real sleeps.
package sim
