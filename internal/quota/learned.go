package quota

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/ratecontrol"
)

// Learner is a governor that can hand what it learned of its model to
// another replica and start from another's (*ratecontrol.Governor). The
// coordinator shares it through quota_learned when the governors
// implement it (see ratecontrol.Learned for what is shared and why).
type Learner interface {
	Learned() ratecontrol.Learned
	Adopt(ratecontrol.Learned) (calibration, rate, warm bool)
}

var _ Learner = (*ratecontrol.Governor)(nil)

const (
	// learnedKeep is how long a row of quota_learned not renewed stays a
	// starting point: longer than any restart, short enough that a replica
	// does not start from a workload long gone.
	learnedKeep = time.Hour
	// fullWindow is the calibration window (flow's outputWindow): rows with
	// at least this many samples are equally informed, and the freshest wins.
	fullWindow = 128
	// scaleStep is the change of a rate cap worth writing again.
	scaleStep = 0.01
	// warmthStep is the change of a warm-up's progress worth writing again.
	warmthStep = 0.05
)

// learnedMark is what was last written of a model.
type learnedMark struct {
	samples int
	scale   float64
	warmth  float64
}

// learnedRows are the rows of quota_learned one round writes.
type learnedRows struct {
	models  []string
	samples []int32
	scales  []float64
	warmths []float64
	cals    []string
	marks   []learnedMark
}

// collectLearned returns this replica's rows whose governors learned
// something since they were last written (settled calls, a moved rate cap).
func (c *Coordinator) collectLearned() learnedRows {
	var rows learnedRows
	for _, name := range c.names {
		lr, ok := c.govs[name].(Learner)
		if !ok {
			continue
		}
		l := lr.Learned()
		mark := learnedMark{samples: l.Calibration.Samples, scale: l.RateScale, warmth: l.Warmth}
		last, written := c.wrote[name]
		if mark.samples == 0 && mark.scale >= 1 && mark.warmth == 0 && !written {
			continue // nothing learned yet
		}
		if written && mark.samples == last.samples && math.Abs(mark.scale-last.scale) < scaleStep &&
			(mark.scale < 1) == (last.scale < 1) && math.Abs(mark.warmth-last.warmth) < warmthStep &&
			(mark.warmth < 1) == (last.warmth < 1) {
			continue
		}
		cal, err := json.Marshal(l.Calibration)
		if err != nil || mark.scale <= 0 || mark.scale > 1 || math.IsNaN(mark.scale) ||
			!(mark.warmth >= 0 && mark.warmth <= 1) {
			continue
		}
		rows.models = append(rows.models, name)
		rows.samples = append(rows.samples, int32(min(mark.samples, math.MaxInt32)))
		rows.scales = append(rows.scales, mark.scale)
		rows.warmths = append(rows.warmths, mark.warmth)
		rows.cals = append(rows.cals, string(cal))
		rows.marks = append(rows.marks, mark)
	}
	return rows
}

// queueWriteLearned queues the upsert of rows into a round's second batch.
func (c *Coordinator) queueWriteLearned(b *pgx.Batch, rows learnedRows) {
	b.Queue(`INSERT INTO quota_learned AS q (model, replica_id, samples, rate_scale, warmth, calibration)
		SELECT u.model, $1, u.samples, u.scale, u.warmth, u.cal::jsonb
		FROM unnest($2::text[], $3::int[], $4::float8[], $5::float8[], $6::text[]) AS u(model, samples, scale, warmth, cal)
		ON CONFLICT (model, replica_id) DO UPDATE SET samples = EXCLUDED.samples, rate_scale = EXCLUDED.rate_scale,
			warmth = EXCLUDED.warmth, calibration = EXCLUDED.calibration, updated_at = now()`,
		c.id, rows.models, rows.samples, rows.scales, rows.warmths, rows.cals)
}

// wroteLearned records rows as written, once their round committed.
func (c *Coordinator) wroteLearned(rows learnedRows) {
	for i, name := range rows.models {
		c.wrote[name] = rows.marks[i]
	}
}

// queueReadLearned queues, for a replica's first round, the other
// replicas' rows to start from: per model the most informed calibration
// (samples up to a full window, then the freshest), and, among the
// replicas whose rows are as fresh as a live lease, the lowest rate cap and
// the highest warmth (the traffic the provider still sees: a replica that
// stopped a moment ago counts, one that went quiet does not).
func (c *Coordinator) queueReadLearned(b *pgx.Batch) {
	b.Queue(`SELECT DISTINCT ON (model) model, replica_id, calibration,
			coalesce(min(rate_scale) FILTER (WHERE updated_at > now() - make_interval(secs => $3)) OVER (PARTITION BY model), 1),
			coalesce(max(warmth) FILTER (WHERE updated_at > now() - make_interval(secs => $3)) OVER (PARTITION BY model), 0)
		FROM quota_learned
		WHERE model = ANY($1) AND replica_id <> $2 AND updated_at > now() - make_interval(secs => $4)
		ORDER BY model, least(samples, $5) DESC, updated_at DESC`,
		c.names, c.id, c.cfg.LeaseTTL.Seconds(), learnedKeep.Seconds(), fullWindow)
}

// offer is another replica's learned state of one model.
type offer struct {
	from    string
	learned ratecontrol.Learned
}

// readLearned reads queueReadLearned's rows. A row whose calibration does
// not decode is skipped: it is a starting point, not a requirement.
func readLearned(br pgx.BatchResults) (map[string]offer, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	out := map[string]offer{}
	var model, from string
	var raw []byte
	var scale, warmth float64
	_, err = pgx.ForEachRow(rows, []any{&model, &from, &raw, &scale, &warmth}, func() error {
		var cal ratecontrol.Calibration
		if json.Unmarshal(raw, &cal) != nil {
			return nil
		}
		out[model] = offer{from: from, learned: ratecontrol.Learned{Calibration: cal, RateScale: scale, Warmth: warmth}}
		return nil
	})
	return out, err
}

// Adoption is what a replica took from the others in its first round.
type Adoption struct {
	From        string  // the replica whose calibration was offered
	Calibration bool    // the calibration was taken
	RateScale   float64 // the rate cap offered (1 = none); taken when Rate
	Rate        bool
	Warmth      float64 // the warm-up's progress offered; taken when Warm
	Warm        bool
}

// adopt hands the offers to the governors, before any share lets them send.
func (c *Coordinator) adopt(offers map[string]offer) map[string]Adoption {
	out := map[string]Adoption{}
	for _, name := range c.names {
		o, ok := offers[name]
		lr, learner := c.govs[name].(Learner)
		if !ok || !learner {
			continue
		}
		cal, rate, warm := lr.Adopt(o.learned)
		a := Adoption{From: o.from, Calibration: cal, RateScale: o.learned.RateScale, Rate: rate,
			Warmth: o.learned.Warmth, Warm: warm}
		out[name] = a
		if cal || rate || warm {
			c.met.adopted.Inc()
			c.log.Info("quota: starting from another replica's calibration", "replica_id", c.id, "model", name,
				"from", o.from, "calibration", cal, "samples", o.learned.Calibration.Samples, "rate_scale", o.learned.RateScale, "rate", rate,
				"warmth", o.learned.Warmth, "warm", warm)
		}
	}
	return out
}

// errLearned wraps a failure of the learned-state statements.
func errLearned(what string, err error) error { return fmt.Errorf("%s learned state: %w", what, err) }
