package rabbitmq

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fakeAckChannel models the broker's side of a channel's acks: the unacked
// deliveries, a multiple ack settling every unacked tag up to its own, and
// an ack or nack of a tag that is not unacked being a protocol error
// (RabbitMQ closes the channel: PRECONDITION_FAILED unknown delivery tag).
type fakeAckChannel struct {
	t         *testing.T
	unacked   []uint64
	requested map[uint64]bool // the caller asked for these acks
	acked     map[uint64]bool
	frames    int
}

func (f *fakeAckChannel) take(tag uint64, multiple bool) []uint64 {
	f.t.Helper()
	k := slices.Index(f.unacked, tag)
	if k < 0 {
		f.t.Fatalf("settle of tag %d that is not unacked (channel error)", tag)
	}
	if !multiple {
		f.unacked = slices.Delete(f.unacked, k, k+1)
		return []uint64{tag}
	}
	var taken, kept []uint64
	for _, u := range f.unacked {
		if u <= tag {
			taken = append(taken, u)
		} else {
			kept = append(kept, u)
		}
	}
	f.unacked = kept
	return taken
}

func (f *fakeAckChannel) Ack(tag uint64, multiple bool) error {
	f.frames++
	for _, u := range f.take(tag, multiple) {
		if !f.requested[u] {
			f.t.Fatalf("ack frame (tag %d, multiple %v) acked tag %d, which is still in hand", tag, multiple, u)
		}
		f.acked[u] = true
	}
	return nil
}

func (f *fakeAckChannel) nack(tag uint64) error {
	f.frames++
	f.take(tag, false)
	return nil
}

func (f *fakeAckChannel) IsClosed() bool            { return false }
func (f *fakeAckChannel) Close() error              { return nil }
func (f *fakeAckChannel) Cancel(string, bool) error { return errors.New("not used") }

// TestAckCoalescingNeverAcksHeldDeliveries drives a consumeChan with random
// interleavings of deliveries, single acks, batch acks and nacks, and
// checks against the broker model that no frame settles a delivery still
// in hand or one settled before, and that after a flush every requested
// ack was sent. The timer never fires (AckDelay is an hour): flushes are
// explicit.
func TestAckCoalescingNeverAcksHeldDeliveries(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			f := &fakeAckChannel{t: t, requested: map[uint64]bool{}, acked: map[uint64]bool{}}
			cc := &consumeChan{ch: f, ackDelay: time.Hour, maxDeferred: 1 + rng.IntN(40)}
			var next uint64
			var held []uint64
			nacked := map[uint64]bool{}
			for step := 0; step < 400; step++ {
				switch op := rng.IntN(10); {
				case op < 4 || len(held) == 0:
					next++
					f.unacked = append(f.unacked, next)
					cc.received(next)
					held = append(held, next)
				case op < 6: // single ack
					k := rng.IntN(len(held))
					tag := held[k]
					held = slices.Delete(held, k, k+1)
					f.requested[tag] = true
					if err := cc.ack([]uint64{tag}, false); err != nil {
						t.Fatal(err)
					}
				case op < 8: // batch ack of a random subset
					rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
					n := 1 + rng.IntN(len(held))
					tags := slices.Clone(held[:n])
					held = held[n:]
					for _, tag := range tags {
						f.requested[tag] = true
					}
					if err := cc.ack(tags, false); err != nil {
						t.Fatal(err)
					}
				case op < 9: // nack
					k := rng.IntN(len(held))
					tag := held[k]
					held = slices.Delete(held, k, k+1)
					nacked[tag] = true
					_ = cc.settleOne(tag, func() error { return f.nack(tag) })
				default:
					cc.flush()
				}
			}
			cc.flush()
			for tag := range f.requested {
				if !f.acked[tag] {
					t.Fatalf("requested ack of %d never sent", tag)
				}
			}
			slices.Sort(held)
			if !slices.Equal(f.unacked, held) {
				t.Fatalf("broker holds %v unacked, consumer holds %v", f.unacked, held)
			}
			// Settled tags stay listed only behind one still in hand.
			var listed []uint64
			for _, tag := range cc.unsettled {
				if _, ok := cc.early[tag]; !ok {
					listed = append(listed, tag)
				}
			}
			if !slices.Equal(listed, held) || len(cc.early) > 0 && (len(held) == 0 || slices.Min(slices.Collect(maps.Keys(cc.early))) < held[0]) {
				t.Fatalf("consumeChan lists %v unsettled (early %v), consumer holds %v", cc.unsettled, cc.early, held)
			}
			if len(cc.ready) != 0 || cc.timer != nil {
				t.Fatalf("after flush: %d acks waiting, timer armed %v", len(cc.ready), cc.timer != nil)
			}
		})
	}
}
