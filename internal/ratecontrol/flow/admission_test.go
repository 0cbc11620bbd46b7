package flow

import (
	"testing"
	"time"
)

// TestUnderEstimateCorrectedByLaterWaits: settling more than was booked
// puts the bucket in debt and the next caller waits for it.
func TestUnderEstimateCorrectedByLaterWaits(t *testing.T) {
	t0 := time.Unix(0, 0)
	a := NewAdmission()
	a.Add(DimTokens, NewBucket(6000, 100, 1000, t0)) // 100 tokens/s
	r := a.Reserve(t0, Cost{{DimTokens, 1000}})
	if r.Wait != 0 {
		t.Fatalf("first wait %v", r.Wait)
	}
	a.Settle(t0, r, Cost{{DimTokens, 1500}}) // 500 more than booked
	if w := a.Reserve(t0, Cost{{DimTokens, 100}}).Wait; w != 6*time.Second {
		t.Fatalf("next wait %v, want 6s (500 debt + 100)", w)
	}
	r2 := a.Reserve(t0, Cost{{DimTokens, 100}})
	a.Settle(t0, r2, Cost{{DimTokens, 0}}) // over-booked: refund
	if w := a.Reserve(t0, Cost{{DimTokens, 100}}).Wait; w != 7*time.Second {
		t.Fatalf("after refund wait %v, want 7s", w)
	}
}

// TestAdmissionBooksTheLogWhenTheCallGoes: a log booking made while another
// limiter still holds the call back would count it before the provider
// does and free its room too early.
func TestAdmissionBooksTheLogWhenTheCallGoes(t *testing.T) {
	t0 := time.Unix(0, 0)
	a := NewAdmission()
	a.Add(DimRequests, NewBucket(1, 1, 0, t0)) // one request a second, empty
	w := NewWindowLog(time.Minute, 1000)
	a.Add(DimTokens, w)
	r := a.Reserve(t0, Cost{{DimTokens, 100}, {DimRequests, 1}})
	if r.Wait != time.Second {
		t.Fatalf("wait %v, want 1s", r.Wait)
	}
	if at := time.Unix(0, w.ents[len(w.ents)-1].at); !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("log booked at %v, want when the bucket lets the call go (%v)", at, t0.Add(time.Second))
	}
	if d := a.Recheck(t0.Add(100*time.Millisecond), t0, r); d != 900*time.Millisecond {
		t.Fatalf("recheck moved the call ahead of the bucket: wait %v, want 900ms", d)
	}
}
