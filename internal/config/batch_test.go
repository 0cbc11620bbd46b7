package config

import (
	"strings"
	"testing"
	"time"
)

func TestBatchDefaultsAndValidation(t *testing.T) {
	c, err := Parse([]byte("models:\n  m:\n    batch:\n      enabled: true\n      completion_window: 2h\n  n: {}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := c.Models["m"].Batch
	if !b.Offloads("low") || b.Offloads("high") || b.MaxJobs != 1000 || b.Gather != time.Minute || b.Discount != 0.5 || b.Window() != "2h" {
		t.Fatalf("defaults: %+v window %s", b, b.Window())
	}
	if c.Models["n"].Batch.Offloads("low") {
		t.Fatal("a model without batch: must not offload")
	}
	for yaml, key := range map[string]string{
		"lanes: [bulk]":    "models.m.batch.lanes",
		"max_jobs: 60000":  "models.m.batch.max_jobs",
		"max_bytes: 10":    "models.m.batch.max_bytes",
		"discount: 1":      "models.m.batch.discount",
		"margin: -1s":      "models.m.batch",
		"max_open: -1":     "models.m.batch.max_open",
		"unknown_field: 1": "unknown_field",
	} {
		_, err := Parse([]byte("models:\n  m:\n    batch:\n      enabled: true\n      "+yaml+"\n"), nil)
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: got %v, want an error naming %s", yaml, err, key)
		}
	}
}
