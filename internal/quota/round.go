package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/config"
)

// lockClass is the first key of the per-model advisory locks
// (pg_advisory_xact_lock(lockClass, hashtext(model))).
const lockClass int32 = 0x6c6c71 // "llq"

// round is one coordination round: one transaction in two round trips:
//
//  1. take every model's advisory lock (in name order, so rounds of
//     different replicas never deadlock), delete expired leases, read the
//     live members and the penalties other replicas reported since the
//     last round;
//  2. renew this replica's lease with its demand and its new share, and
//     commit.
//
// Decreases reach the governors before the commit, increases after it, so
// the shares applied across replicas never sum above the limit.
func (c *Coordinator) round(ctx context.Context, start time.Time) (Report, error) {
	rep := Report{Models: make(map[string]ModelReport, len(c.names))}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	n := len(c.names)
	cur := make([]Share, n)
	demand := make([]Demand, n)
	known := make([]bool, n)
	for i, name := range c.names {
		c.mu.Lock()
		cur[i] = c.applied[name]
		c.mu.Unlock()
		demand[i], known[i] = c.measure(name, cur[i], start)
	}

	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return rep, fmt.Errorf("quota round: acquire connection: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			// The pool discards a connection left inside a transaction;
			// the rollback only spares it when it still answers.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_, _ = conn.Exec(rctx, "ROLLBACK")
			rcancel()
		}
		conn.Release()
	}()

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// A replica that stalls inside a round must not hold the locks for
	// long: the server ends its transaction. Leases are soft state,
	// re-published every round: the commit need not wait for the WAL flush
	// (visibility to the other replicas is the same).
	ms := fmt.Sprintf("%dms", max(c.timeout.Milliseconds(), 1))
	b.Queue(`SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true),
		set_config('synchronous_commit', 'off', true)`, ms)
	for _, name := range c.names {
		b.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, lockClass, name)
	}
	b.Queue(`DELETE FROM quota_members WHERE model = ANY($1) AND expires_at < now()`, c.names)
	b.Queue(`SELECT model, replica_id, demand_requests, demand_tokens, share_requests, share_tokens
		FROM quota_members WHERE model = ANY($1) AND replica_id <> $2 ORDER BY model, replica_id`, c.names, c.id)
	firstRound := c.lastSeq < 0
	if firstRound {
		// Start after the penalties already there: they are history, and so
		// are those of the late window, which the next rounds read again.
		b.Queue(`SELECT seq, model, kind, code, retry_after_ms, at, now() FROM quota_penalties
			WHERE seq = (SELECT max(seq) FROM quota_penalties) OR at > now() - make_interval(secs => $1)`, c.lateWindow.Seconds())
	} else {
		b.Queue(`SELECT seq, model, kind, code, retry_after_ms, at, now() FROM quota_penalties
			WHERE (seq > $1 OR at > now() - make_interval(secs => $4)) AND replica_id <> $2 AND model = ANY($3)
			ORDER BY seq`, c.lastSeq, c.id, c.names, c.lateWindow.Seconds())
	}
	if firstRound {
		c.queueReadLearned(b)
	}
	c.rounds++
	prune := c.rounds%pruneEvery == 0
	if prune {
		// Kept past the late window, or a late penalty could go unread.
		b.Queue(`DELETE FROM quota_penalties WHERE at < now() - make_interval(secs => $1)`, max(penaltyKeep, 2*c.lateWindow).Seconds())
		b.Queue(`DELETE FROM quota_learned WHERE updated_at < now() - make_interval(secs => $1)`, learnedKeep.Seconds())
	}

	br := conn.SendBatch(ctx, b)
	rd, err := readRound(br, n, firstRound, prune)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return rep, fmt.Errorf("quota round: %w", err)
	}
	others, pens := rd.members, rd.penalties
	// A joining replica's governors start from what the others learned
	// before any share lets them send (their share is 0 until this round's
	// increases, after the commit).
	var adopted map[string]Adoption
	if firstRound {
		adopted = c.adopt(rd.learned)
	}
	learned := c.collectLearned()

	next := make([]Share, n)
	dr, dt := make([]float64, n), make([]float64, n)
	sr, st := make([]float64, n), make([]float64, n)
	for i, name := range c.names {
		d := demand[i]
		if !known[i] {
			d = typicalDemand(others[name], c.models[name])
		}
		ms := append(others[name], Member{ReplicaID: c.id, Demand: d, Share: cur[i]})
		target := Target(c.id, ms, c.models[name], c.floor)
		nx := Next(c.id, ms, target, cur[i])
		if !changed(nx, cur[i]) {
			nx = cur[i]
		}
		next[i] = nx
		// Decreases now, before anyone can read the new share.
		if pre := (Share{min(nx.Requests, cur[i].Requests), min(nx.Tokens, cur[i].Tokens)}); pre != cur[i] {
			c.setLimits(name, pre)
		}
		ms[len(ms)-1].Share = nx
		dr[i], dt[i], sr[i], st[i] = d.Requests, d.Tokens, nx.Requests, nx.Tokens
		mr := ModelReport{Members: ms, Target: target, Applied: nx}
		if a, ok := adopted[name]; ok {
			mr.Adopted = &a
		}
		rep.Models[name] = mr
		c.met.members.WithLabelValues(name).Set(float64(len(ms)))
	}

	b = &pgx.Batch{}
	b.Queue(`INSERT INTO quota_members AS q (model, replica_id, demand_requests, demand_tokens, share_requests, share_tokens, expires_at)
		SELECT u.model, $1, u.dr, u.dt, u.sr, u.st, now() + make_interval(secs => $2)
		FROM unnest($3::text[], $4::float8[], $5::float8[], $6::float8[], $7::float8[]) AS u(model, dr, dt, sr, st)
		ON CONFLICT (model, replica_id) DO UPDATE SET
			demand_requests = EXCLUDED.demand_requests, demand_tokens = EXCLUDED.demand_tokens,
			share_requests = EXCLUDED.share_requests, share_tokens = EXCLUDED.share_tokens,
			renewed_at = now(), expires_at = EXCLUDED.expires_at`,
		c.id, c.cfg.LeaseTTL.Seconds(), c.names, dr, dt, sr, st)
	if len(learned.models) > 0 {
		c.queueWriteLearned(b, learned)
	}
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	if _, err = br.Exec(); err != nil {
		err = fmt.Errorf("renew lease: %w", err)
	} else if err = execIf(br, len(learned.models) > 0); err != nil {
		err = errLearned("write", err)
	} else if _, err = br.Exec(); err != nil {
		err = fmt.Errorf("commit: %w", err)
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return rep, fmt.Errorf("quota round: %w", err)
	}
	committed = true
	c.lastRenew = start
	c.wroteLearned(learned)
	// Increases only now that every other replica can see them.
	for i, name := range c.names {
		c.mu.Lock()
		now := c.applied[name]
		c.mu.Unlock()
		if next[i] != now {
			c.setLimits(name, next[i])
		}
	}
	c.applyPenalties(pens, firstRound)
	return rep, nil
}

// typicalDemand stands in for the demand of a replica that has not sent
// anything yet: the mean of the others' (so a newcomer to a busy quota
// claims an equal share at once, and one to an idle quota the floor), or
// the whole limit when it is alone.
func typicalDemand(others []Member, m config.Model) Demand {
	if len(others) == 0 {
		r, t := rates(m)
		return Demand{Requests: r, Tokens: t}
	}
	var d Demand
	for _, o := range others {
		d.Requests += o.Demand.Requests
		d.Tokens += o.Demand.Tokens
	}
	return Demand{Requests: d.Requests / float64(len(others)), Tokens: d.Tokens / float64(len(others))}
}

// roundRead is what the first batch of a round read.
type roundRead struct {
	members   map[string][]Member // the other live members per model
	penalties []penalty           // new penalties of the others
	learned   map[string]offer    // first round only: the others' learned state
}

// execIf reads the result of a statement queued only when queued is true.
func execIf(br pgx.BatchResults, queued bool) error {
	if !queued {
		return nil
	}
	_, err := br.Exec()
	return err
}

// readRound reads the first batch's results in the order round queued
// them: the other live members per model, the new penalties, the others'
// learned state (first round) and the prunes.
func readRound(br pgx.BatchResults, models int, firstRound, prune bool) (roundRead, error) {
	members, pens, err := readMembers(br, models)
	if err != nil {
		return roundRead{}, err
	}
	rd := roundRead{members: members, penalties: pens}
	if firstRound {
		if rd.learned, err = readLearned(br); err != nil {
			return roundRead{}, errLearned("read", err)
		}
	}
	if prune {
		if _, err := br.Exec(); err != nil {
			return roundRead{}, fmt.Errorf("prune penalties: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return roundRead{}, errLearned("prune", err)
		}
	}
	return rd, nil
}

// readMembers reads the members and the penalties.
func readMembers(br pgx.BatchResults, models int) (map[string][]Member, []penalty, error) {
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("begin: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("set timeouts: %w", err)
	}
	for range models {
		if _, err := br.Exec(); err != nil {
			return nil, nil, fmt.Errorf("lock model: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("expire leases: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("read members: %w", err)
	}
	members := make(map[string][]Member)
	var model string
	var m Member
	_, err = pgx.ForEachRow(rows, []any{&model, &m.ReplicaID, &m.Demand.Requests, &m.Demand.Tokens, &m.Share.Requests, &m.Share.Tokens},
		func() error {
			members[model] = append(members[model], m)
			return nil
		})
	if err != nil {
		return nil, nil, fmt.Errorf("read members: %w", err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("read penalties: %w", err)
	}
	var pens []penalty
	var p penalty
	var retryMS int64
	_, err = pgx.ForEachRow(rows, []any{&p.seq, &p.model, &p.kind, &p.code, &retryMS, &p.at, &p.read}, func() error {
		p.retryAfter = time.Duration(retryMS) * time.Millisecond
		pens = append(pens, p)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read penalties: %w", err)
	}
	return members, pens, nil
}
