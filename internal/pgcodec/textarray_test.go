package pgcodec_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/pgcodec"
	"github.com/llmq/llmq/internal/testsvc"
)

var cases = map[string][]string{
	"nil":     nil,
	"empty":   {},
	"one":     {"a"},
	"several": {`{"messages": [{"role": "user", "content": "hi, \"you\""}]}`, "", "ünïcødé ✓", "NULL", "{a,b}", `back\slash`},
	"long":    {strings.Repeat("x", 70_000), strings.Repeat("y", 3)},
}

// TestTextArrayEncodesAsPgx holds the codec to pgx's own binary encoding
// of a []string and of a []json.RawMessage (NULL elements included), byte
// for byte, after whatever the buffer held.
func TestTextArrayEncodesAsPgx(t *testing.T) {
	ours, theirs := pgtype.NewMap(), pgtype.NewMap()
	pgcodec.Register(ours)
	values := map[string]any{}
	for name, ss := range cases {
		values[name] = ss
	}
	for name, rs := range rawCases() {
		values["raw "+name] = rs
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			prefix := []byte("earlier params")
			got, err := ours.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, v, slices.Clone(prefix))
			if err != nil {
				t.Fatal(err)
			}
			want, err := theirs.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, v, slices.Clone(prefix))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoded %q\nwant     %q", got, want)
			}
		})
	}
}

// TestTextArrayGrowsTheBufferOnce is why the codec exists: pgx's encoding
// boxed every element and reallocated the parameter buffer at every
// quarter of growth, so its allocations grew with the array. The same for
// a []json.RawMessage, the store's requests.
func TestTextArrayGrowsTheBufferOnce(t *testing.T) {
	m := pgtype.NewMap()
	pgcodec.Register(m)
	allocs := func(n int, raw bool) float64 {
		ss := make([]string, n)
		for i := range ss {
			ss[i] = strings.Repeat("r", 1024)
		}
		var v any = ss
		if raw {
			v = raws(ss)
		}
		return testing.AllocsPerRun(20, func() {
			if _, err := m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, v, make([]byte, 0, 256)); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, raw := range []bool{false, true} {
		small, large := allocs(16, raw), allocs(1024, raw)
		// the test's buffer, the one growth, and pgtype.Map's own
		if small != large || large > 4 {
			t.Errorf("raw %v: %v allocations for 16 elements, %v for 1,024: want the same, at most 4", raw, small, large)
		}
	}
}

// TestTextArrayRoundTrip sends each case through a real server and reads
// it back, on a pool Configure set up.
func TestTextArrayRoundTrip(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testsvc.PostgresEmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var before bool
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error { before = true; return nil }
	pgcodec.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if !before {
		t.Error("Configure dropped the pool's own AfterConnect")
	}
	typ, _ := conn.Conn().TypeMap().TypeForOID(pgtype.TextArrayOID)
	if !pgcodec.Registered(typ.Codec) {
		t.Fatalf("text[] codec on a configured connection is %T", typ.Codec)
	}
	for name, ss := range cases {
		t.Run(name, func(t *testing.T) {
			var back []string
			var n *int32
			var isNull bool
			err := conn.QueryRow(ctx, `SELECT $1::text[], cardinality($1::text[]), $1::text[] IS NULL`, ss).Scan(&back, &n, &isNull)
			if err != nil {
				t.Fatal(err)
			}
			if isNull != (ss == nil) {
				t.Fatalf("NULL on the server: %v, for a nil slice: %v", isNull, ss == nil)
			}
			if ss != nil && (n == nil || int(*n) != len(ss)) {
				t.Fatalf("cardinality %v, want %d", n, len(ss))
			}
			if !slices.Equal(back, ss) {
				t.Fatalf("read back %d elements, want %d (or different text)", len(back), len(ss))
			}
			// unnest is how the store reads these arrays
			rows, err := conn.Query(ctx, `SELECT u, n FROM unnest($1::text[]) WITH ORDINALITY AS t(u, n)`, ss)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				var s string
				var n int64
				err := r.Scan(&s, &n)
				return s, err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(ss) || (len(ss) > 0 && !slices.Equal(got, ss)) {
				t.Fatalf("unnest gave %d elements, want %d", len(got), len(ss))
			}
		})
	}
	// Text Postgres refuses stays refused, with the server's reason.
	var s []string
	err = conn.QueryRow(ctx, `SELECT $1::text[]`, []string{"a\x00b"}).Scan(&s)
	if err == nil || !strings.Contains(err.Error(), "0x00") {
		t.Errorf("a NUL in an element: %v, want the server's invalid byte sequence error", err)
	}
}

// With the simple protocol (PgBouncer's transaction pooling) parameters go
// as text, which the codec leaves to pgx's own.
func TestTextArrayThroughTheSimpleProtocol(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testsvc.PostgresEmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pgcodec.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for name, ss := range cases {
		var back []string
		if err := pool.QueryRow(ctx, `SELECT $1::text[]`, ss).Scan(&back); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(back, ss) {
			t.Errorf("%s: read back %d elements, want %d (or different text)", name, len(back), len(ss))
		}
	}
}

// raws is ss as the store passes requests: one json.RawMessage each, nil
// for nil.
func raws(ss []string) []json.RawMessage {
	if ss == nil {
		return nil
	}
	out := make([]json.RawMessage, len(ss))
	for i, s := range ss {
		out[i] = json.RawMessage(s)
	}
	return out
}

// rawCases are cases as []json.RawMessage, and one with a NULL element.
func rawCases() map[string][]json.RawMessage {
	out := map[string][]json.RawMessage{"null element": {json.RawMessage(`{}`), nil, json.RawMessage(``)}}
	for name, ss := range cases {
		out[name] = raws(ss)
	}
	return out
}

// TestRawArrayRoundTrip sends each []json.RawMessage case through a real
// server as the store does, over the extended protocol (this codec) and
// the simple one (pgx's), and reads it back as text: a [][]byte would come
// back as bytea's hex over the simple protocol.
func TestRawArrayRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		cfg, err := pgxpool.ParseConfig(testsvc.PostgresEmptyURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pgcodec.Configure(cfg)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for name, rs := range rawCases() {
			var back []*string
			if err := pool.QueryRow(ctx, `SELECT $1::text[]`, rs).Scan(&back); err != nil {
				t.Fatalf("%v, %s: %v", mode, name, err)
			}
			if (back == nil) != (rs == nil) || len(back) != len(rs) {
				t.Fatalf("%v, %s: read back %d elements (nil %v), want %d (nil %v)", mode, name, len(back), back == nil, len(rs), rs == nil)
			}
			for i, r := range rs {
				if (back[i] == nil) != (r == nil) || (r != nil && *back[i] != string(r)) {
					t.Errorf("%v, %s: element %d read back %v, want %q", mode, name, i, back[i], r)
				}
			}
		}
		pool.Close()
	}
}
