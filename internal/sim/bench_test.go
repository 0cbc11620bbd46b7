package sim

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
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

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRate reports wall-clock throughput and, since the machine may be
// shared, throughput per CPU-second of this process (client included), which
// is what the simulator would do with two free cores divided by two.
func reportRate(b *testing.B, start time.Time, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	b.ReportMetric(float64(b.N)/(cpuTime()-cpu0).Seconds(), "req/cpu-s")
}

// BenchmarkServeHTTP calls the handler directly from parallel goroutines.
func BenchmarkServeHTTP(b *testing.B) {
	s := benchSim(b)
	b.ReportAllocs()
	start, cpu0 := time.Now(), cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		w := &discardWriter{h: http.Header{}}
		body := bytes.NewReader(benchBody)
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
		for pb.Next() {
			body.Reset(benchBody)
			req.Body = io.NopCloser(body)
			clear(w.h)
			w.code = 0
			s.ServeHTTP(w, req)
			if w.code != http.StatusOK {
				b.Fatalf("status %d", w.code)
			}
		}
	})
	reportRate(b, start, cpu0)
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
	start, cpu0 := time.Now(), cpuTime()
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
	reportRate(b, start, cpu0)
}

// discardWriter is a reusable ResponseWriter, so the benchmark measures the
// simulator rather than httptest's recorder.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}
