package rabbitmq

import (
	"testing"
	"time"
)

// A routing key the broker returned goes unpublished for unboundFor, then
// is probed again; a bound key is probed once per unboundFor and published
// plainly in between.
func TestRoutesSkipUnboundKeysForASecond(t *testing.T) {
	var r routes
	t0 := time.Unix(1000, 0)
	step := func(key string, at time.Time, wantPublish, wantProbe bool) {
		t.Helper()
		publish, probe := r.plan(key, at)
		if publish != wantPublish || probe != wantProbe {
			t.Fatalf("%s at +%s: publish=%v probe=%v, want %v %v", key, at.Sub(t0), publish, probe, wantPublish, wantProbe)
		}
	}
	step("acme.succeeded", t0, true, true)
	r.markUnbound("acme.succeeded", t0)
	step("acme.succeeded", t0.Add(500*time.Millisecond), false, false)
	step("acme.failed", t0.Add(500*time.Millisecond), true, true) // keys are judged apart
	step("acme.failed", t0.Add(600*time.Millisecond), true, false)
	step("acme.succeeded", t0.Add(unboundFor), true, true) // probed again
	step("acme.succeeded", t0.Add(unboundFor+time.Millisecond), true, false)
	step("acme.failed", t0.Add(500*time.Millisecond+unboundFor), true, true)
}
