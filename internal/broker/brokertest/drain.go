package brokertest

import (
	"errors"
	"testing"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// testDrainKeepsDeadLettersOnError: dead letters that the caller failed to
// record stay in the dead-letter queue and are handed out again; once
// recorded they are gone.
func testDrainKeepsDeadLettersOnError(t *testing.T, d Driver) {
	ctx := ctxFor(t)
	publish(t, ctx, d.NewPublisher(t), job.PriorityNormal, msg(1), msg(2))
	ch := subscribe(t, ctx, d.NewSubscriber(t), job.PriorityNormal, 2)
	for range 2 {
		got := receive(t, ch)
		if err := got.DeadLetter(ctx, broker.DeadLetter{Reason: "poison"}); err != nil {
			t.Fatalf("dead letter: %v", err)
		}
	}
	reader := d.DeadLetters(t)
	storeDown := errors.New("store down")
	var offered []string
	err := reader.DrainDeadLetters(ctx, 1, func(dls []broker.DeadLetter) error {
		for _, dl := range dls {
			offered = append(offered, dl.Key)
		}
		return storeDown
	})
	if !errors.Is(err, storeDown) || len(offered) != 1 {
		t.Fatalf("drain with a failing record: err %v, offered %v; want the record's error after one dead letter", err, offered)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		err := reader.DrainDeadLetters(ctx, 10, func(dls []broker.DeadLetter) error {
			for _, dl := range dls {
				if seen[dl.Key] {
					t.Fatalf("dead letter %s handed out twice after it was recorded", dl.Key)
				}
				seen[dl.Key] = true
			}
			return nil
		})
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
	}
	if !seen[offered[0]] {
		t.Fatalf("the dead letter whose record failed (%s) was not handed out again", offered[0])
	}
}
