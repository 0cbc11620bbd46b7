package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/llmq/llmq/internal/job"
)

// job.Validate refuses a request that Postgres's jsonb cannot store (a
// NUL or lone-surrogate escape, a number numeric cannot hold), so that one
// such job cannot fail the batch insert of every job read with it. This
// asks the server about the same requests: Validate must refuse exactly
// those the server refuses.
func TestValidateAgreesWithJSONB(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t)
	ctx := context.Background()
	values := []string{`1`, `-2.5e10`, `1e131071`, `1e131072`, `123e131069`, `123e131070`, `0.05e131073`,
		`1e-16383`, `1e-16384`, `0.5e-16383`, `0e999999`, `0e-20000`, `-1E+999999`, `1e99999999999`,
		`"\u0000"`, `"\ud800"`, `"\ud83d\ude00"`, `"\\ud800"`, `"\udc00\ud800"`}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		frac := strings.Repeat("0", rng.IntN(3)) + fmt.Sprint(rng.IntN(100))
		values = append(values, fmt.Sprintf("%d.%se%d", rng.IntN(1000), frac, rng.IntN(2*maxExp())-maxExp()))
	}
	for _, v := range values {
		request := `{"messages": [{"role": "user", "content": "hi"}], "x": ` + v + `}`
		j := job.Job{ID: "agree", Model: "qwen-plus", Request: []byte(request)}
		j.Normalize()
		refused := j.Validate(time.Now(), job.Limits{}) != nil
		_, err := pool.Exec(ctx, `SELECT $1::jsonb`, request)
		assert.Equal(t, err != nil, refused, "%s: server error %v", v, err)
	}
}

// maxExp spans both of numeric's bounds (131072 digits before the point,
// 16383 after) with room around them.
func maxExp() int { return 140000 }
