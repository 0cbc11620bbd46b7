package soak

import (
	"fmt"
	"sort"
	"time"
)

// Fault is one thing the soak does to the pipeline at At after the start.
type Fault struct {
	At     time.Duration
	Kind   string // "kill", "restart-rabbitmq", "restart-postgres"
	Target string // the consumer to kill
}

// Schedule is the run's faults: a consumer SIGKILL every killEvery
// (rotating over the victims), one RabbitMQ restart at 5/12 of the run and
// one Postgres restart at 7/12, between the kills of a 30-minute run
// (12.5 and 17.5 minutes) so each fault's recovery is seen on its own.
func Schedule(d, killEvery time.Duration, victims []string) []Fault {
	var out []Fault
	if killEvery > 0 && len(victims) > 0 {
		for k, at := 0, killEvery; at < d; k, at = k+1, at+killEvery {
			out = append(out, Fault{At: at, Kind: "kill", Target: victims[k%len(victims)]})
		}
	}
	out = append(out, Fault{At: d * 5 / 12, Kind: "restart-rabbitmq"}, Fault{At: d * 7 / 12, Kind: "restart-postgres"})
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// Victims are the consumers the soak kills: every one but the first, so
// one consumer lives through the whole run and its RSS shows a leak; the
// only one when there is one.
func Victims(consumers int) []string {
	if consumers == 1 {
		return []string{ConsumerName(1)}
	}
	var v []string
	for i := 2; i <= consumers; i++ {
		v = append(v, ConsumerName(i))
	}
	return v
}

// ConsumerName is the i-th consumer's role name (and worker id).
func ConsumerName(i int) string { return fmt.Sprintf("consumer-%d", i) }

// FaultLog is what happened when a fault was applied.
type FaultLog struct {
	Fault
	Started time.Time
	Took    time.Duration
	Note    string // pid killed, or the command and its error
}
