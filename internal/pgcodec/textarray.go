// Package pgcodec holds the pgx codecs llmq puts on its Postgres
// connections in place of pgx's own.
//
// The store sends a batch's requests, responses and attempt logs as text[]
// parameters (one unnest statement a batch). pgx encodes a []string by
// boxing each element and appending it to a parameter buffer that starts
// at 256 bytes and grows by a quarter at a time: for a batch of 1 KB
// requests that buffer was reallocated and copied a dozen times, and the
// consumer threw away several times each batch's bytes (BENCHMARKS.md,
// "One allocation a text array").
package pgcodec

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Configure makes every connection of the pool cfg describes use the
// codecs here, after whatever AfterConnect cfg already has.
func Configure(cfg *pgxpool.Config) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		Register(conn.TypeMap())
		return nil
	}
}

// NewPool opens a pool on url whose connections use the codecs here.
func NewPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	Configure(cfg)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Register puts the codecs on m: text[] encodes a []string in binary with
// one allocation at most. Everything else is pgx's.
func Register(m *pgtype.Map) {
	t, ok := m.TypeForOID(pgtype.TextArrayOID)
	if !ok {
		return
	}
	ac, ok := t.Codec.(*pgtype.ArrayCodec)
	if !ok {
		return // registered by someone else already
	}
	m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: textArrayCodec{ac}})
}

// textArrayCodec is pgx's text[] codec with its own binary encoding of a
// []string.
type textArrayCodec struct{ *pgtype.ArrayCodec }

func (c textArrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.([]string); ok && format == pgtype.BinaryFormatCode {
		return stringsBinary{elem: c.ElementType.OID}
	}
	return c.ArrayCodec.PlanEncode(m, oid, format, value)
}

// stringsBinary writes a []string as PostgreSQL's binary array (array_recv):
// the header, one dimension with lower bound 1 (also for an empty slice, as
// pgx sends it), then each element's length and bytes. A nil slice is NULL.
type stringsBinary struct{ elem uint32 }

func (p stringsBinary) Encode(value any, buf []byte) ([]byte, error) {
	ss := value.([]string)
	if ss == nil {
		return nil, nil
	}
	if len(ss) > math.MaxInt32 {
		return nil, fmt.Errorf("pgcodec: %d elements do not fit a text[]", len(ss))
	}
	size := 20
	for _, s := range ss {
		if len(s) > math.MaxInt32 {
			return nil, fmt.Errorf("pgcodec: a text[] element of %d bytes", len(s))
		}
		size += 4 + len(s)
	}
	buf = slices.Grow(buf, size)
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	buf = binary.BigEndian.AppendUint32(buf, 0) // no NULL element
	buf = binary.BigEndian.AppendUint32(buf, p.elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(ss)))
	buf = binary.BigEndian.AppendUint32(buf, 1) // lower bound
	for _, s := range ss {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
		buf = append(buf, s...)
	}
	return buf, nil
}
