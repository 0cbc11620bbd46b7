package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/job"
)

// Subscriber consumes lanes, one AMQP channel (with its own prefetch) per
// subscription, and publishes retries and dead letters with confirms on its
// own connection.
type Subscriber struct {
	s   *session
	pub *confirmer
	wg  sync.WaitGroup

	mu     sync.Mutex
	closed bool
	seq    int
	chans  map[*consumeChan]struct{} // open consume channels (Close flushes their acks)
}

var _ broker.Subscriber = (*Subscriber)(nil)

// NewSubscriber connects (declaring the topology) and returns a Subscriber.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := newSession(cfg, "subscriber")
	if _, err := s.connection(ctx); err != nil {
		s.close()
		return nil, fmt.Errorf("rabbitmq subscriber: %w", err)
	}
	return &Subscriber{s: s, pub: newConfirmer(s)}, nil
}

// Subscribe consumes the lane's quorum queue with at most prefetch
// unsettled deliveries. The channel keeps delivering across reconnects and
// closes when ctx ends (deliveries in hand stay settleable until Close) or
// on Close.
func (s *Subscriber) Subscribe(ctx context.Context, lane job.Priority, prefetch int) (<-chan broker.Delivery, error) {
	if !lane.Valid() {
		return nil, fmt.Errorf("rabbitmq: subscribe: unknown lane %q", lane)
	}
	if prefetch < 1 {
		prefetch = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, broker.ErrClosed
	}
	s.seq++
	sub := &subscription{
		owner: s, lane: lane, prefetch: prefetch, queue: s.s.names.lane(lane),
		tag: fmt.Sprintf("llmq-%s-%d", lane, s.seq),
	}
	out := make(chan broker.Delivery)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		sub.run(ctx, out)
	}()
	return out, nil
}

// Close stops every subscription and closes the connection: the broker
// takes back every unsettled delivery, and settling one afterwards fails.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	chans := s.chans
	s.chans = nil
	s.mu.Unlock()
	for cc := range chans {
		cc.flushForClose()
	}
	s.s.close()
	s.wg.Wait()
	return nil
}

type subscription struct {
	owner    *Subscriber
	lane     job.Priority
	prefetch int
	queue    string
	tag      string
}

// consumeChan is one AMQP channel of a subscription and the deliveries it
// handed out and are not settled yet.
//
// Acks are coalesced. Every tag the channel delivered is listed in
// unsettled, in delivery order, until its settlement frame is sent. An ack
// of the oldest unsettled tag is sent at once, as one basic.ack with
// multiple=true that also carries every ack requested for the tags right
// behind it; an ack requested for a tag behind one still in hand (jobs
// finish out of order) waits in ready until the tags before it are
// settled, or at most ackDelay, and is then sent. For a quorum queue each
// ack frame is a settle command in its Raft log, and an out-of-order ack
// makes the channel search its unacked list, so coalescing saves most of
// the broker's work per message. Deferred acks hold prefetch slots, so
// once half the prefetch waits they all go out. A deferred ack is never
// lost silently: drain and the subscriber's Close send the pending ones
// first; if the channel dies before they are sent, the broker delivers
// those messages again, as for any unsettled delivery.
type consumeChan struct {
	ch       ackChannel
	ackDelay time.Duration

	mu       sync.Mutex
	pending  int
	draining bool
	// unsettled: tags delivered whose settlement frame is not sent, in
	// delivery order; a tag settled out of order (Nack, a single ack) stays
	// here until the tags before it are settled, and is in early meanwhile.
	unsettled []uint64
	early     map[uint64]struct{}
	ready     map[uint64]struct{} // acks requested, frame not sent yet
	timer     *time.Timer         // sends ready; armed while ready is not empty
	// maxDeferred caps ready: deferred acks hold prefetch slots, so at half
	// the prefetch they all go out at once.
	maxDeferred int
	noDefer     bool // set by flush: acks go out at once
}

// ackChannel is what consumeChan uses of its *amqp.Channel.
type ackChannel interface {
	Ack(tag uint64, multiple bool) error
	IsClosed() bool
	Close() error
	Cancel(consumer string, noWait bool) error
}

// received records a tag the channel delivered; tags must be recorded in
// delivery order, before the delivery can be settled.
func (c *consumeChan) received(tag uint64) {
	c.mu.Lock()
	c.unsettled = append(c.unsettled, tag)
	c.mu.Unlock()
}

// settleOne sends the settlement of one tag (send) and records it. Every
// frame is sent under mu, so that no multiple ack can pass a settlement
// that is recorded but not yet sent.
func (c *consumeChan) settleOne(tag uint64, send func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := send()
	c.markSettled(tag)
	if len(c.ready) > 0 {
		// Acks waiting behind tag may be at the head now.
		_ = c.sendHeadRun()
		c.stopTimerIfIdle()
	}
	return err
}

// stopTimerIfIdle disarms the timer when no ack waits. Caller holds mu.
func (c *consumeChan) stopTimerIfIdle() {
	if len(c.ready) == 0 && c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// markSettled records that tag's settlement was sent. Caller holds mu.
func (c *consumeChan) markSettled(tag uint64) {
	if len(c.unsettled) > 0 && c.unsettled[0] == tag {
		c.unsettled = c.unsettled[1:]
		c.popEarly()
		return
	}
	if c.early == nil {
		c.early = make(map[uint64]struct{})
	}
	c.early[tag] = struct{}{}
}

// popEarly drops the settled tags at the head of unsettled. Caller holds mu.
func (c *consumeChan) popEarly() {
	for len(c.unsettled) > 0 {
		if _, ok := c.early[c.unsettled[0]]; !ok {
			return
		}
		delete(c.early, c.unsettled[0])
		c.unsettled = c.unsettled[1:]
	}
}

// ack requests the ack of tags (distinct, delivered on this channel, not
// settled). It fails only when the channel is already closed (the broker
// delivers those messages again); otherwise the acks are sent now or
// within ackDelay.
func (c *consumeChan) ack(tags []uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch.IsClosed() {
		return amqp.ErrClosed
	}
	if c.ready == nil {
		c.ready = make(map[uint64]struct{}, len(tags))
	}
	for _, t := range tags {
		c.ready[t] = struct{}{}
	}
	err := c.sendHeadRun()
	if len(c.ready) == 0 {
		c.stopTimerIfIdle()
		return err
	}
	if c.noDefer || c.ackDelay <= 0 || len(c.ready) >= c.maxDeferred {
		c.sendReady()
		return err
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(c.ackDelay, c.flush)
	}
	return err
}

// sendHeadRun sends one ack for the run of ready (and already settled)
// tags at the head of unsettled. Caller holds mu.
func (c *consumeChan) sendHeadRun() error {
	var last uint64
	run, n := 0, 0
	for k, t := range c.unsettled {
		if _, ok := c.ready[t]; ok {
			last, run = t, k+1
			n++
			continue
		}
		if _, ok := c.early[t]; !ok {
			break
		}
	}
	if n == 0 {
		return nil
	}
	err := c.ch.Ack(last, n > 1)
	for _, t := range c.unsettled[:run] {
		delete(c.ready, t)
		delete(c.early, t)
	}
	c.unsettled = c.unsettled[run:]
	c.popEarly()
	return err
}

// sendReady sends every requested ack: the head run in one frame, the
// others one by one. Caller holds mu.
func (c *consumeChan) sendReady() {
	_ = c.sendHeadRun()
	rest := make([]uint64, 0, len(c.ready))
	for t := range c.ready {
		rest = append(rest, t)
	}
	slices.Sort(rest)
	for _, t := range rest {
		_ = c.ch.Ack(t, false)
		c.markSettled(t)
	}
	clear(c.ready)
	c.stopTimerIfIdle()
}

// flush sends the deferred acks (the timer's function).
func (c *consumeChan) flush() {
	c.mu.Lock()
	c.sendReady()
	c.mu.Unlock()
}

// flushForClose sends the deferred acks and makes later acks go out at
// once: the connection is about to close.
func (c *consumeChan) flushForClose() {
	c.mu.Lock()
	c.noDefer = true
	c.sendReady()
	c.mu.Unlock()
}

// settled accounts one settled delivery; a draining channel closes once its
// last delivery is settled.
func (c *consumeChan) settled() {
	c.mu.Lock()
	c.pending--
	closeNow := c.draining && c.pending == 0
	if closeNow {
		c.sendReady()
	}
	c.mu.Unlock()
	if closeNow {
		_ = c.ch.Close()
	}
}

func (c *consumeChan) drain() {
	c.mu.Lock()
	c.draining = true
	closeNow := c.pending == 0
	if closeNow {
		c.sendReady()
	}
	c.mu.Unlock()
	if closeNow {
		_ = c.ch.Close()
	}
}

func (sub *subscription) run(ctx context.Context, out chan<- broker.Delivery) {
	log := sub.owner.s.cfg.Logger
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !sub.owner.s.backoff(ctx, attempt) {
			return
		}
		cc, msgs, err := sub.open(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return
			}
			log.Warn("rabbitmq subscribe failed", "lane", sub.lane, "attempt", attempt, "error", err)
			continue
		}
		if attempt > 0 {
			log.Info("rabbitmq subscription resumed", "lane", sub.lane)
		}
		attempt = 0
		if sub.consume(ctx, cc, msgs, out) {
			return
		}
		sub.owner.forget(cc)
		log.Warn("rabbitmq subscription lost, reconnecting", "lane", sub.lane)
	}
}

func (sub *subscription) open(ctx context.Context) (*consumeChan, <-chan amqp.Delivery, error) {
	conn, err := sub.owner.s.connection(ctx)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(sub.prefetch, 0, false); err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("qos: %w", err)
	}
	msgs, err := ch.Consume(sub.queue, sub.tag, false, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("consume %s: %w", sub.queue, err)
	}
	cc := &consumeChan{ch: ch, ackDelay: sub.owner.s.cfg.AckDelay, maxDeferred: max(sub.prefetch/2, 1)}
	o := sub.owner
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		_ = ch.Close()
		return nil, nil, broker.ErrClosed
	}
	if o.chans == nil {
		o.chans = make(map[*consumeChan]struct{})
	}
	o.chans[cc] = struct{}{}
	o.mu.Unlock()
	return cc, msgs, nil
}

// forget drops a consume channel that is gone from the Close list.
func (s *Subscriber) forget(cc *consumeChan) {
	s.mu.Lock()
	delete(s.chans, cc)
	s.mu.Unlock()
}

// consume hands msgs out until the channel is lost (false) or ctx ends or
// the subscriber closes (true).
func (sub *subscription) consume(ctx context.Context, cc *consumeChan, msgs <-chan amqp.Delivery, out chan<- broker.Delivery) bool {
	stop := func() bool {
		// No new deliveries; those in hand stay settleable until the
		// channel drains or the subscriber closes.
		_ = cc.ch.Cancel(sub.tag, false)
		for m := range msgs {
			_ = m.Nack(false, true)
		}
		cc.drain()
		return true
	}
	for {
		var m amqp.Delivery
		var ok bool
		select {
		case m, ok = <-msgs:
			if !ok {
				return false
			}
		case <-ctx.Done():
			return stop()
		case <-sub.owner.s.done:
			return true
		}
		if cc.ch.IsClosed() {
			// Buffered from a channel that is gone: the broker has taken it
			// back and delivers it again on the next channel.
			continue
		}
		cc.received(m.DeliveryTag)
		if due, ok := dueAt(m.Headers); ok && time.Until(due) > 0 {
			sub.retier(ctx, cc, m, due)
			continue
		}
		cc.mu.Lock()
		cc.pending++
		cc.mu.Unlock()
		d := &delivery{sub: sub, cc: cc, m: m, msg: messageOf(m)}
		select {
		case out <- d:
		case <-ctx.Done():
			_ = cc.settleOne(m.DeliveryTag, func() error { return m.Nack(false, true) })
			cc.settled()
			return stop()
		case <-sub.owner.s.done:
			return true
		}
	}
}

// retier sends a delayed retry that arrived before its due time back to the
// retry tier that fits the time left.
func (sub *subscription) retier(ctx context.Context, cc *consumeChan, m amqp.Delivery, due time.Time) {
	msg := messageOf(m)
	if err := sub.publishDelayed(ctx, msg, due); err != nil {
		sub.owner.s.cfg.Logger.Warn("rabbitmq re-tier failed", "lane", sub.lane, "job_id", msg.Key, "error", err)
		_ = cc.settleOne(m.DeliveryTag, func() error { return m.Nack(false, true) })
		return
	}
	_ = cc.settleOne(m.DeliveryTag, func() error { return m.Ack(false) })
}

// publishDelayed publishes msg to the retry tier for the time left to due.
func (sub *subscription) publishDelayed(ctx context.Context, msg broker.Message, due time.Time) error {
	s := sub.owner.s
	tier := broker.PickTier(s.cfg.RetryTiers, time.Until(due))
	extra := amqp.Table{
		headerTier:         tierName(tier),
		broker.HeaderDueAt: strconv.FormatInt(due.UnixMilli(), 10),
	}
	return sub.owner.pub.publish(ctx, s.names.retry, string(sub.lane), publishing(msg, extra))
}

// messageOf is the broker.Message of a delivery; broker headers
// (x-death, x-delivery-count, …) and llmq's own x-llmq-* are left out.
func messageOf(m amqp.Delivery) broker.Message {
	msg := broker.Message{Key: m.MessageId, Body: m.Body}
	for k, v := range m.Headers {
		if strings.HasPrefix(k, "x-llmq-") || k == headerTier || strings.HasPrefix(k, "x-death") ||
			strings.HasPrefix(k, "x-first-death") || strings.HasPrefix(k, "x-last-death") ||
			k == "x-delivery-count" {
			continue
		}
		if s, ok := v.(string); ok {
			if msg.Headers == nil {
				msg.Headers = make(map[string]string)
			}
			msg.Headers[k] = s
		}
	}
	return msg
}

type delivery struct {
	sub *subscription
	cc  *consumeChan
	m   amqp.Delivery
	msg broker.Message

	mu   sync.Mutex
	done bool
}

var (
	_ broker.Delivery   = (*delivery)(nil)
	_ broker.BatchAcker = (*delivery)(nil)
)

func (d *delivery) Message() broker.Message { return d.msg }
func (d *delivery) Lane() job.Priority      { return d.sub.lane }

// Redelivered is the AMQP redelivered flag (quorum queues also count
// deliveries in x-delivery-count).
func (d *delivery) Redelivered() bool {
	if d.m.Redelivered {
		return true
	}
	switch n := d.m.Headers["x-delivery-count"].(type) {
	case int64:
		return n > 0
	case int32:
		return n > 0
	}
	return false
}

// settle runs publish (if any), then settle, exactly once. A settle that
// fails because the channel is gone leaves the message with the broker,
// which delivers it again; the delivery is then finished too.
func (d *delivery) settle(op string, publish func() error, settle func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrSettled
	}
	if publish != nil {
		if err := publish(); err != nil {
			return fmt.Errorf("rabbitmq: %s %s: %w", op, d.msg.Key, err)
		}
	}
	err := d.cc.settleOne(d.m.DeliveryTag, settle)
	d.done = true
	d.cc.settled()
	return d.settleError(op, err)
}

func (d *delivery) settleError(op string, err error) error {
	if err != nil {
		return fmt.Errorf("rabbitmq: %s %s: channel lost, the broker delivers it again: %w: %v",
			op, d.msg.Key, broker.ErrClosed, err)
	}
	return nil
}

// Ack requests the ack; the frame may go out up to AckDelay later,
// coalesced with others (see consumeChan).
func (d *delivery) Ack(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return broker.ErrSettled
	}
	err := d.cc.ack([]uint64{d.m.DeliveryTag})
	d.done = true
	d.cc.settled()
	return d.settleError("ack", err)
}

// AckBatch implements broker.BatchAcker: the deliveries of each channel
// are acked together (consumeChan.ack), other deliveries by their own Ack.
func (d *delivery) AckBatch(ctx context.Context, ds []broker.Delivery) []error {
	errs := make([]error, len(ds))
	type group struct {
		idx  []int
		tags []uint64
		ds   []*delivery
	}
	groups := make(map[*consumeChan]*group)
	var order []*consumeChan
	for i, x := range ds {
		rd, ok := x.(*delivery)
		if !ok {
			errs[i] = x.Ack(ctx)
			continue
		}
		rd.mu.Lock()
		if rd.done {
			rd.mu.Unlock()
			errs[i] = broker.ErrSettled
			continue
		}
		rd.done = true // from here on, the ack below is its settlement
		rd.mu.Unlock()
		g := groups[rd.cc]
		if g == nil {
			g = &group{}
			groups[rd.cc] = g
			order = append(order, rd.cc)
		}
		g.idx, g.tags, g.ds = append(g.idx, i), append(g.tags, rd.m.DeliveryTag), append(g.ds, rd)
	}
	for _, cc := range order {
		g := groups[cc]
		err := cc.ack(g.tags)
		for j, d := range g.ds {
			errs[g.idx[j]] = d.settleError("ack", err)
			cc.settled()
		}
	}
	return errs
}

func (d *delivery) Nack(ctx context.Context) error {
	return d.settle("nack", nil, func() error { return d.m.Nack(false, true) })
}

func (d *delivery) Retry(ctx context.Context, delay time.Duration, headers map[string]string) error {
	msg := d.msg
	msg.Headers = broker.MergeHeaders(d.msg.Headers, headers)
	publish := func() error {
		if delay <= 0 {
			s := d.sub.owner.s
			return d.sub.owner.pub.publish(ctx, s.names.jobs, string(d.sub.lane), publishing(msg, nil))
		}
		return d.sub.publishDelayed(ctx, msg, time.Now().Add(delay))
	}
	return d.settle("retry", publish, func() error { return d.m.Ack(false) })
}

func (d *delivery) DeadLetter(ctx context.Context, dl broker.DeadLetter) error {
	if dl.Body == nil {
		dl.Body = d.msg.Body
	}
	if dl.Key == "" {
		dl.Key = d.msg.Key
	}
	if dl.Lane == "" {
		dl.Lane = d.sub.lane
	}
	publish := func() error {
		body, err := json.Marshal(dl)
		if err != nil {
			return fmt.Errorf("encode envelope: %w", err)
		}
		s := d.sub.owner.s
		pub := amqp.Publishing{
			MessageId: dl.Key, DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Headers: amqp.Table{headerEnvelope: "1"}, Body: body,
		}
		return d.sub.owner.pub.publish(ctx, s.names.dlx, string(dl.Lane), pub)
	}
	return d.settle("dead-letter", publish, func() error { return d.m.Ack(false) })
}
