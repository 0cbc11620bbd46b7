package kafka

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// groupConsumer is a consumer-group reader whose offsets are committed
// only up to the lowest unfinished offset of each partition, by its own
// commit loop, coalescing commits under load.
type groupConsumer struct {
	r   *kafkago.Reader
	log *slog.Logger

	mu       sync.Mutex
	trackers map[int]*offsetTracker
	toCommit map[int]commitPoint      // partition → what to commit next
	queued   map[*offsetTracker]int64 // highest next offset put in toCommit per tracker
	retryIn  time.Duration            // wait before retrying a failed commit; 0 after a success
	topic    string

	wake     chan struct{}
	stop     chan struct{}
	loopDone chan struct{}
}

func newGroupConsumer(cfg Config, topic, group string) *groupConsumer {
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:           cfg.Brokers,
		Dialer:            newDialer(cfg),
		GroupID:           group,
		Topic:             topic,
		MinBytes:          1,
		MaxBytes:          10 << 20,
		MaxWait:           250 * time.Millisecond,
		StartOffset:       kafkago.FirstOffset,
		CommitInterval:    0, // our commit loop commits synchronously
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  cfg.SessionTimeout,
		HeartbeatInterval: time.Second,
		JoinGroupBackoff:  250 * time.Millisecond,
		ReadBackoffMin:    10 * time.Millisecond,
		ReadBackoffMax:    250 * time.Millisecond,
	})
	g := &groupConsumer{
		r: r, log: cfg.Logger, topic: topic,
		trackers: make(map[int]*offsetTracker), toCommit: make(map[int]commitPoint), queued: make(map[*offsetTracker]int64),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	go g.commitLoop()
	return g
}

// fetch returns the next message and the tracker that follows it.
func (g *groupConsumer) fetch(ctx context.Context) (kafkago.Message, *offsetTracker, error) {
	m, err := g.r.FetchMessage(ctx)
	if err != nil {
		return m, nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	tr := g.trackers[m.Partition]
	if tr == nil || !tr.fetched(m.Offset) {
		// New or rewound partition (a rebalance): earlier in-flight
		// messages of the old tracker no longer commit anything.
		if old := g.trackers[m.Partition]; old != nil {
			delete(g.queued, old)
		}
		tr = newOffsetTracker()
		tr.fetched(m.Offset)
		g.trackers[m.Partition] = tr
		delete(g.toCommit, m.Partition)
	}
	return m, tr, nil
}

// commitPoint is the next offset to read of a partition, to commit, and
// the tracker it comes from.
type commitPoint struct {
	tr   *offsetTracker
	next int64
}

// finish marks a message done and schedules a commit if the partition's
// lowest unfinished offset moved. Messages of one partition finish on
// several goroutines, so a lower point can arrive after a higher one: it
// is dropped, or the commit would go back.
func (g *groupConsumer) finish(tr *offsetTracker, partition int, offset int64) {
	next, advanced := tr.finish(offset)
	if !advanced {
		return
	}
	g.mu.Lock()
	if g.trackers[partition] == tr && next > g.queued[tr] {
		g.queued[tr] = next
		g.toCommit[partition] = commitPoint{tr: tr, next: next}
	}
	g.mu.Unlock()
	g.wakeUp()
}

func (g *groupConsumer) wakeUp() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

func (g *groupConsumer) commitLoop() {
	defer close(g.loopDone)
	for {
		select {
		case <-g.wake:
			g.commit()
		case <-g.stop:
			g.commit()
			return
		}
	}
}

// commit commits what toCommit holds. A failed commit (a broker restart, a
// coordinator that moved, a rebalance) puts its points back, unless a
// higher one or a new tracker came meanwhile, and is tried again after a
// wait that doubles from 250 ms to 10 s: left alone, an idle partition's
// offset would stay behind messages already settled, which the next
// reader would read again and the lane's depth would count for ever.
func (g *groupConsumer) commit() {
	g.mu.Lock()
	if len(g.toCommit) == 0 {
		g.mu.Unlock()
		return
	}
	points := make(map[int]commitPoint, len(g.toCommit))
	msgs := make([]kafkago.Message, 0, len(g.toCommit))
	for p, cp := range g.toCommit {
		points[p] = cp
		// CommitMessages commits Offset+1.
		msgs = append(msgs, kafkago.Message{Topic: g.topic, Partition: p, Offset: cp.next - 1})
	}
	clear(g.toCommit)
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := g.r.CommitMessages(ctx, msgs...)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil || errors.Is(err, io.ErrClosedPipe) {
		g.retryIn = 0
		return
	}
	g.log.Warn("kafka commit failed; will retry", "topic", g.topic, "error", err)
	for p, cp := range points {
		if cur, ok := g.toCommit[p]; g.trackers[p] == cp.tr && (!ok || cur.next < cp.next) {
			g.toCommit[p] = cp
		}
	}
	g.retryIn = min(max(2*g.retryIn, 250*time.Millisecond), 10*time.Second)
	select {
	case <-g.stop:
		// Closing: the final commit is the one that just failed; what it
		// held is read again by the next reader (at least once).
	default:
		time.AfterFunc(g.retryIn, g.wakeUp)
	}
}

// close makes a final commit and closes the reader (leaving the group).
func (g *groupConsumer) close() error {
	close(g.stop)
	<-g.loopDone
	return g.r.Close()
}
