package sim

import (
	"math/rand/v2"
	"sync"
)

// fault is what the fault injector decided for one request.
type fault int

const (
	faultNone fault = iota
	fault500
	fault503
	faultTimeout
	faultReset
)

var faultNames = [...]string{faultNone: "none", fault500: "error_500", fault503: "error_503", faultTimeout: "timeout", faultReset: "reset"}

func (f fault) String() string { return faultNames[f] }

// faulter draws faults in a deterministic sequence from a seeded PCG.
type faulter struct {
	cfg FaultConfig
	mu  sync.Mutex
	rng *rand.Rand
}

func newFaulter(cfg FaultConfig) *faulter {
	return &faulter{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
}

func (f *faulter) draw() fault {
	if !f.cfg.enabled() {
		return faultNone
	}
	f.mu.Lock()
	x := f.rng.Float64()
	f.mu.Unlock()
	c := f.cfg
	switch {
	case x < c.ErrorRate/2:
		return fault500
	case x < c.ErrorRate:
		return fault503
	case x < c.ErrorRate+c.TimeoutRate:
		return faultTimeout
	case x < c.ErrorRate+c.TimeoutRate+c.ResetRate:
		return faultReset
	}
	return faultNone
}
