package sim

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// benchSim has limits far above what a benchmark reaches, so every window
// is maintained and checked but nothing is refused.
func benchSim(b *testing.B) *Simulator {
	s, err := New(Config{Models: map[string]ModelConfig{"m": {
		RPM: 1 << 40, TPM: 1 << 50, RPS: 1 << 30, TPS: 1 << 40,
		Burst: BurstConfig{Floor: 1 << 30, Growth: 2},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s
}

var benchBody = []byte(chatBody("m", strings.Repeat("Summarise this support ticket. ", 30), `,"max_tokens":512`))

func reportRate(b *testing.B, start time.Time) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}

// BenchmarkServeHTTP calls the handler directly from parallel goroutines.
func BenchmarkServeHTTP(b *testing.B) {
	s := benchSim(b)
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchBody))
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
	reportRate(b, start)
}

// BenchmarkLoopback goes through a real HTTP server on 127.0.0.1 with
// keep-alive connections.
func BenchmarkLoopback(b *testing.B) {
	s := benchSim(b)
	srv := httptest.NewServer(s)
	b.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	url := srv.URL + "/v1/chat/completions"
	b.SetParallelism(8)
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(url, "application/json", bytes.NewReader(benchBody))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
	reportRate(b, start)
}
