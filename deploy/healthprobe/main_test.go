package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llmq/llmq/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func TestProbe(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := probe([]string{srv.URL + "/readyz"}); err != nil {
		t.Fatalf("ready server: %v", err)
	}
	if err := probe([]string{srv.URL + "/other"}); err == nil {
		t.Fatal("503 must fail the probe")
	}
	if err := probe(nil); err == nil {
		t.Fatal("missing URL must fail")
	}
	srv.Close()
	if err := probe([]string{srv.URL + "/readyz"}); err == nil {
		t.Fatal("closed server must fail the probe")
	}
}
