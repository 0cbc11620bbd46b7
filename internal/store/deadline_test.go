package store_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testsvc"
)

// pausableProxy forwards TCP to a server until paused; paused, it holds
// what it reads and answers nothing, as a Postgres behind a partition, a
// stopped VM or a wedged proxy does.
type pausableProxy struct {
	ln     net.Listener
	target string
	paused atomic.Bool
	wg     sync.WaitGroup
}

func newPausableProxy(t testing.TB, target string) *pausableProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pausableProxy{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() { ln.Close(); p.paused.Store(false) })
	return p
}

func (p *pausableProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *pausableProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.paused.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A store call against a Postgres that stops answering fails at the
// store's deadline (context.DeadlineExceeded), and the store answers again
// once Postgres does.
func TestStoreCallsHaveADeadline(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testsvc.PostgresURL(t))
	require.NoError(t, err)
	proxy := newPausableProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := store.New(pool).WithTimeout(500 * time.Millisecond)
	ctx := context.Background()

	key := job.Key{Tenant: "acme", ID: "wedged"}
	mustInsert(t, s, sampleJob(key.Tenant, key.ID))

	proxy.paused.Store(true)
	_, err = s.ClaimBatch(ctx, []job.Key{key}, "w1", time.Minute)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the call ends at its deadline: %v", err)
	_, err = s.Get(ctx, key)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	proxy.paused.Store(false)
	require.Eventually(t, func() bool {
		rec, err := s.Get(ctx, key)
		return err == nil && rec.Status == job.StatusQueued
	}, 10*time.Second, 50*time.Millisecond, "the job is untouched and the store answers again")
}
