package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Inspector reports the consumer-group lag of each priority's intake and
// lane and reads the dead-letter topic.
type Inspector struct {
	cfg         Config
	client      *kafkago.Client
	closeClient func()

	mu          sync.Mutex
	dead        *groupConsumer
	pendingDead []pendingDeadLetter // fetched, not yet recorded
}

var (
	_ broker.Inspector        = (*Inspector)(nil)
	_ broker.DeadLetterReader = (*Inspector)(nil)
)

// NewInspector creates missing topics and returns an Inspector.
func NewInspector(ctx context.Context, cfg Config) (*Inspector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ensureTopics(ctx, cfg); err != nil {
		return nil, fmt.Errorf("kafka inspector: %w", err)
	}
	client, done := newClient(cfg)
	return &Inspector{cfg: cfg, client: client, closeClient: done}, nil
}

// Depth is the lag of the priority's intake groups on its intake topics
// (the shared one and the tenants' own) plus
// that of its lane group on its lane topic: per partition, the end offset
// minus the committed offset (the start offset where nothing is committed).
// It counts in-flight, unacked messages too.
func (in *Inspector) Depth(ctx context.Context, lane job.Priority) (int64, error) {
	if !lane.Valid() {
		return 0, fmt.Errorf("kafka: depth: unknown lane %q", lane)
	}
	var intake int64
	for _, src := range in.cfg.intakeSources(lane) {
		n, err := in.lag(ctx, src.topic, src.group)
		if err != nil {
			return 0, fmt.Errorf("kafka: depth %s: %w", lane, err)
		}
		intake += n
	}
	lag, err := in.lag(ctx, in.cfg.laneTopic(lane), in.cfg.laneGroup(lane))
	if err != nil {
		return 0, fmt.Errorf("kafka: depth %s: %w", lane, err)
	}
	return intake + lag, nil
}

// lag is group's lag on topic.
func (in *Inspector) lag(ctx context.Context, topic, group string) (int64, error) {
	meta, err := in.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata: %w", err)
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return 0, fmt.Errorf("topic %s missing", topic)
	}
	var ids []int
	var firsts, lasts []kafkago.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		ids = append(ids, p.ID)
		firsts = append(firsts, kafkago.FirstOffsetOf(p.ID))
		lasts = append(lasts, kafkago.LastOffsetOf(p.ID))
	}
	// One request per kind: a request naming a partition twice is not
	// answered by every broker.
	first, err := in.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{
		Topics: map[string][]kafkago.OffsetRequest{topic: firsts}})
	if err != nil {
		return 0, fmt.Errorf("list first offsets of %s: %w", topic, err)
	}
	last, err := in.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{
		Topics: map[string][]kafkago.OffsetRequest{topic: lasts}})
	if err != nil {
		return 0, fmt.Errorf("list last offsets of %s: %w", topic, err)
	}
	committed, err := in.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{
		GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return 0, fmt.Errorf("offset fetch %s: %w", group, err)
	}
	if committed.Error != nil && !errors.Is(committed.Error, kafkago.GroupIdNotFound) {
		return 0, fmt.Errorf("offset fetch %s: %w", group, committed.Error)
	}
	done := map[int]int64{}
	for _, p := range committed.Topics[topic] {
		done[p.Partition] = p.CommittedOffset
	}
	from := map[int]int64{}
	for _, p := range first.Topics[topic] {
		if p.Error != nil {
			return 0, fmt.Errorf("%s partition %d: %w", topic, p.Partition, p.Error)
		}
		from[p.Partition] = max(p.FirstOffset, done[p.Partition])
	}
	var lag int64
	for _, p := range last.Topics[topic] {
		if p.Error != nil {
			return 0, fmt.Errorf("%s partition %d: %w", topic, p.Partition, p.Error)
		}
		lag += max(p.LastOffset-from[p.Partition], 0)
	}
	return lag, nil
}

// deadLetterIdle is how long ReadDeadLetters waits for more once it has one.
const deadLetterIdle = 200 * time.Millisecond

// DrainDeadLetters reads the dead-letter topic in its own consumer group:
// it waits for the first dead letter, takes those that follow within a
// short idle window, at most max, and commits them once record returns
// nil. On an error the batch is kept and handed out first by the next
// call (a group cannot re-read what it fetched without a restart), and its
// offsets stay uncommitted, so a crash re-reads it too. A call ended by
// the cancellation of ctx (a timeout is not one) leaves the group
// (leaveDeadGroup).
func (in *Inspector) DrainDeadLetters(ctx context.Context, max int, record func([]broker.DeadLetter) error) (err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	defer func() {
		if err != nil && errors.Is(ctx.Err(), context.Canceled) && in.dead != nil {
			in.leaveDeadGroup()
		}
	}()
	if in.dead == nil {
		in.dead = newGroupConsumer(in.cfg, in.cfg.deadTopic(), in.cfg.deadGroup())
	}
	for len(in.pendingDead) < max {
		fctx := ctx
		var cancel context.CancelFunc = func() {}
		if len(in.pendingDead) > 0 {
			fctx, cancel = context.WithTimeout(ctx, deadLetterIdle)
		}
		m, tr, err := in.dead.fetch(fctx)
		cancel()
		if err != nil {
			if len(in.pendingDead) > 0 && errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return fmt.Errorf("kafka: read dead letters: %w", err)
		}
		var dl broker.DeadLetter
		if err := json.Unmarshal(m.Value, &dl); err != nil {
			dl = broker.DeadLetter{Body: m.Value, Key: string(m.Key), Reason: "undecodable_envelope"}
		}
		in.pendingDead = append(in.pendingDead, pendingDeadLetter{dl: dl, tr: tr, partition: m.Partition, offset: m.Offset})
	}
	dls := make([]broker.DeadLetter, len(in.pendingDead))
	for i, p := range in.pendingDead {
		dls[i] = p.dl
	}
	if err := record(dls); err != nil {
		return err
	}
	for _, p := range in.pendingDead {
		in.dead.finish(p.tr, p.partition, p.offset)
	}
	in.pendingDead = nil
	return nil
}

// leaveDeadGroup closes the dead-letter reader, committing what was
// recorded, once a drain is cancelled: the reconciler drains only while it
// leads, and a reader left open (the Inspector stays open for Depth) would
// keep its share of the topic's partitions in the group, which the next
// leader would then never read. What was fetched and not recorded is read
// again by whoever gets its partitions.
func (in *Inspector) leaveDeadGroup() {
	if err := in.dead.close(); err != nil {
		in.cfg.Logger.Warn("kafka: close dead-letter reader", "error", err)
	}
	in.dead, in.pendingDead = nil, nil
}

// StopDraining leaves the dead-letter group, as a cancelled drain does
// (leaveDeadGroup): the reconciler calls it when its drain loop ends, which
// can happen between two drains (the lead lost while it waited to retry).
func (in *Inspector) StopDraining() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.dead != nil {
		in.leaveDeadGroup()
	}
}

// pendingDeadLetter is a dead letter fetched and not yet recorded.
type pendingDeadLetter struct {
	dl        broker.DeadLetter
	tr        *offsetTracker
	partition int
	offset    int64
}

// ReadDeadLetters is DrainDeadLetters returning what it took.
func (in *Inspector) ReadDeadLetters(ctx context.Context, max int) ([]broker.DeadLetter, error) {
	return broker.ReadDeadLetters(ctx, max, in.DrainDeadLetters)
}

// Close closes the dead-letter reader and idle connections.
func (in *Inspector) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	var err error
	if in.dead != nil {
		err = in.dead.close()
		in.dead = nil
	}
	in.closeClient()
	return err
}
