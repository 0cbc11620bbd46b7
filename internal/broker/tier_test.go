package broker

import (
	"testing"
	"time"
)

func TestPickTier(t *testing.T) {
	tiers := DefaultRetryTiers
	cases := []struct {
		remaining, want time.Duration
	}{
		{0, 200 * time.Millisecond},
		{100 * time.Millisecond, 200 * time.Millisecond},
		{time.Second, time.Second},
		{4 * time.Second, time.Second},
		{29 * time.Second, 5 * time.Second},
		{time.Hour, 10 * time.Minute},
	}
	for _, c := range cases {
		if got := PickTier(tiers, c.remaining); got != c.want {
			t.Errorf("PickTier(%v) = %v, want %v", c.remaining, got, c.want)
		}
	}
}

func TestMergeHeaders(t *testing.T) {
	base := map[string]string{"a": "1", "b": "2"}
	got := MergeHeaders(base, map[string]string{"b": "3"})
	if got["a"] != "1" || got["b"] != "3" || base["b"] != "2" {
		t.Fatalf("MergeHeaders = %v (base %v)", got, base)
	}
}
