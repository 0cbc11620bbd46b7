package sim

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEventLogMatchesBruteForce checks the ring's window answers against a
// plain list over random traffic, evictions and ring growth included.
func TestEventLogMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l eventLog
	type ev struct{ t, tok int64 }
	var all []ev
	now := int64(0)
	const w = 1000
	for range 10000 {
		now += rng.Int64N(40)
		l.evict(now - 3*w)
		for len(all) > 0 && all[0].t <= now-3*w {
			all = all[1:]
		}
		limit := 1 + rng.Int64N(60)
		need := 1 + rng.Int64N(limit)
		var c, sum int64
		var inWin []ev
		for _, e := range all {
			if e.t > now-w {
				c++
				sum += e.tok
				inWin = append(inWin, e)
			}
		}
		ok, wait := l.requestWait(now, w, limit)
		require.Equal(t, c+1 <= limit, ok)
		if !ok { // after wait, exactly limit-1 remain
			require.Equal(t, inWin[c-limit].t+w-now, wait)
		}
		ok, wait = l.tokenWait(now, w, limit, need)
		require.Equal(t, sum+need <= limit, ok)
		if !ok {
			freed := int64(0)
			for _, e := range inWin {
				freed += e.tok
				if sum-freed+need <= limit {
					require.Equal(t, e.t+w-now, wait)
					break
				}
			}
		}
		if rng.IntN(2) == 0 {
			tok := 1 + rng.Int64N(20)
			l.push(now, tok)
			all = append(all, ev{now, tok})
		}
	}
}
