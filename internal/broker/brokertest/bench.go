package brokertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// benchBody is a 1 KB job body, the size docs/design.md#measured measured with.
var benchBody = func() []byte {
	b := make([]byte, 1024)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}()

// BenchPublish measures confirmed publishes of 1 KB messages from
// concurrent publishers sharing one Publisher; it reports msgs/s.
func BenchPublish(b *testing.B, p broker.Publisher, publishers int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	next := make(chan int, 1024)
	errs := make(chan error, publishers)
	b.SetBytes(int64(len(benchBody)))
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < publishers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				msg := broker.Message{Key: fmt.Sprintf("bench-%d", i), Body: benchBody}
				if err := p.Publish(ctx, job.PriorityNormal, msg); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < b.N; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatalf("publish: %v", err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchConsume publishes b.N messages (untimed), then measures consuming and
// acking them with prefetch 100; it reports msgs/s.
func BenchConsume(b *testing.B, p broker.Publisher, s broker.Subscriber) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.StopTimer()
	var wg sync.WaitGroup
	next := make(chan int, 1024)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				msg := broker.Message{Key: fmt.Sprintf("bench-%d", i), Body: benchBody}
				if err := p.Publish(ctx, job.PriorityNormal, msg); err != nil {
					b.Errorf("publish: %v", err)
					return
				}
			}
		}()
	}
	for i := 0; i < b.N; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	b.SetBytes(int64(len(benchBody)))
	b.StartTimer()
	start := time.Now()
	ch, err := s.Subscribe(ctx, job.PriorityNormal, 100)
	if err != nil {
		b.Fatalf("subscribe: %v", err)
	}
	for i := 0; i < b.N; i++ {
		d, ok := <-ch
		if !ok {
			b.Fatal("subscription closed early")
		}
		if err := d.Ack(ctx); err != nil {
			b.Fatalf("ack: %v", err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
