package flow

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
)

func TestConcurrencyLimiterFIFOAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewConcurrencyLimiter(1)
		if err := c.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var order []int
		done := make(chan struct{}, 3)
		for i := range 3 {
			cx := t.Context()
			if i == 1 {
				cx = ctx
			}
			go func() {
				if err := c.Acquire(cx); err != nil {
					order = append(order, -i)
					done <- struct{}{}
					return
				}
				order = append(order, i)
				c.Release()
				done <- struct{}{}
			}()
			synctest.Wait() // queued in this order
		}
		cancel()
		<-done // the cancelled one leaves first
		if c.Waiting() != 2 {
			t.Fatalf("waiting %d", c.Waiting())
		}
		c.Release()
		<-done
		<-done
		if fmt.Sprint(order) != "[-1 0 2]" {
			t.Fatalf("order %v", order)
		}
		c.SetLimit(3)
		if c.InFlight() != 0 || c.Limit() != 3 {
			t.Fatalf("in flight %d limit %d", c.InFlight(), c.Limit())
		}
	})
}
