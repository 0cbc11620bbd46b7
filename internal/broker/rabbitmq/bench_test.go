package rabbitmq_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/brokertest"
)

// The driver's figures (BenchmarkPublishConfirm, BenchmarkConsumeAck) are
// meant to be read against the raw amqp091 baselines below, measured the
// same way on the same queue and machine load.

func BenchmarkPublishConfirm(b *testing.B) {
	cfg := testConfig(b)
	brokertest.BenchPublish(b, newPublisher(b, cfg), 64)
}

func BenchmarkConsumeAck(b *testing.B) {
	cfg := testConfig(b)
	brokertest.BenchConsume(b, newPublisher(b, cfg), newSubscriber(b, cfg))
}

// BenchmarkRawPublishConfirm: amqp091 alone, one confirm channel, 64
// goroutines with deferred confirms.
func BenchmarkRawPublishConfirm(b *testing.B) {
	cfg := testConfig(b)
	newPublisher(b, cfg) // declares the topology
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	next := make(chan int, 1024)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				dc, err := ch.PublishWithDeferredConfirm(cfg.Prefix+"llmq.lanes", "normal", false, false,
					amqp.Publishing{MessageId: fmt.Sprint(i), DeliveryMode: amqp.Persistent, Body: body})
				if err != nil {
					b.Error(err)
					return
				}
				if !dc.Wait() {
					b.Error("nack")
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
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkRawConsumeAck: amqp091 alone, prefetch 100, one ack per message.
func BenchmarkRawConsumeAck(b *testing.B) {
	cfg := testConfig(b)
	p := newPublisher(b, cfg)
	b.StopTimer()
	body := make([]byte, 1024)
	ctx := context.Background()
	next := make(chan int, 1024)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := p.Publish(ctx, "normal", rawMsg(i, body)); err != nil {
					b.Error(err)
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
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(100, 0, false); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	msgs, err := ch.Consume(cfg.Prefix+"llmq.lane.normal", "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		m := <-msgs
		if err := m.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

func rawMsg(i int, body []byte) broker.Message {
	return broker.Message{Key: fmt.Sprint(i), Body: body}
}
