package kafka_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/broker/brokertest"
	"github.com/llmq/llmq/internal/broker/kafka"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/testsvc"
)

// The driver's figures are meant to be read against the raw kafka-go
// baselines below, measured the same way on the same cluster and load.

func BenchmarkPublish(b *testing.B) {
	cfg := testConfig(b)
	brokertest.BenchPublish(b, newPublisher(b, cfg), 64)
}

func BenchmarkConsumeAck(b *testing.B) {
	cfg := testConfig(b)
	brokertest.BenchConsume(b, newPublisher(b, cfg), newSubscriber(b, cfg))
}

// BenchmarkRawProduce: one kafka-go Writer (BatchTimeout 2ms, acks all), 64
// goroutines each writing one message at a time.
func BenchmarkRawProduce(b *testing.B) {
	cfg := testConfig(b)
	newPublisher(b, cfg) // creates the topics
	w := &kafkago.Writer{Addr: kafkago.TCP(cfg.Brokers...), Balancer: &kafkago.Hash{},
		BatchTimeout: 2 * time.Millisecond, BatchSize: 1000, RequiredAcks: kafkago.RequireAll,
		Transport: &kafkago.Transport{}}
	defer func() {
		_ = w.Close()
		w.Transport.(*kafkago.Transport).CloseIdleConnections()
	}()
	topic := cfg.Prefix + "llmq.lane." + string(job.PriorityNormal)
	body := make([]byte, 1024)
	next := make(chan int, 1024)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := w.WriteMessages(context.Background(), kafkago.Message{Topic: topic, Key: []byte(fmt.Sprint(i)), Value: body}); err != nil {
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
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkRawConsumeCommit: a kafka-go group Reader, FetchMessage then a
// synchronous CommitMessages per message.
func BenchmarkRawConsumeCommit(b *testing.B) {
	cfg := testConfig(b)
	p := newPublisher(b, cfg)
	b.StopTimer()
	body := make([]byte, 1024)
	next := make(chan int, 1024)
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := p.Publish(context.Background(), job.PriorityNormal, rawMsg(i, body)); err != nil {
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
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: cfg.Brokers, GroupID: cfg.Prefix + "raw",
		Topic: cfg.Prefix + "llmq.lane.normal", MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 250 * time.Millisecond,
		StartOffset: kafkago.FirstOffset, HeartbeatInterval: time.Second, JoinGroupBackoff: 250 * time.Millisecond})
	defer r.Close()
	ctx := context.Background()
	b.StartTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

func rawMsg(i int, body []byte) broker.Message {
	return broker.Message{Key: fmt.Sprint(i), Body: body}
}

// BenchmarkPublishSecured: what TLS and SASL cost a publish, each on its
// own in-process cluster (connections are set up once, outside the timer).
func BenchmarkPublishSecured(b *testing.B) {
	const pass = "bench-password-0123"
	for _, tc := range []struct {
		name string
		cfg  func(b *testing.B) kafka.Config
	}{
		{"plain", func(b *testing.B) kafka.Config { return kafka.Config{Brokers: newCluster(b)} }},
		{"sasl-plain", func(b *testing.B) kafka.Config {
			m, _ := kafka.SASL("plain", "u", pass)
			return kafka.Config{Brokers: newCluster(b, kfake.EnableSASL(), kfake.Superuser("PLAIN", "u", pass)), SASL: m}
		}},
		{"sasl-scram-sha-256", func(b *testing.B) kafka.Config {
			m, _ := kafka.SASL("scram-sha-256", "u", pass)
			return kafka.Config{Brokers: newCluster(b, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "u", pass)), SASL: m}
		}},
		{"tls", func(b *testing.B) kafka.Config {
			cert, ca := selfSignedCA(b, b.TempDir())
			tc, err := kafka.TLSConfig(ca, "", "", false)
			if err != nil {
				b.Fatal(err)
			}
			return kafka.Config{Brokers: newCluster(b, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})), TLS: tc}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := tc.cfg(b)
			cfg.Prefix = testsvc.KafkaPrefix(b)
			brokertest.BenchPublish(b, newPublisher(b, cfg), 64)
		})
	}
}
