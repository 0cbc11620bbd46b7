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
	"encoding/json"
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

// Register puts the codecs on m: text[] encodes a []string or a
// []json.RawMessage in binary with one allocation at most. Everything else
// is pgx's.
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
// []string and of a []json.RawMessage. The store passes the requests it
// read off the broker as []json.RawMessage, so that a job's 1 KB is not
// copied into a string first; pgx's own codec, which the simple protocol
// uses, sends that type as text too (a [][]byte it would send as bytea).
type textArrayCodec struct{ *pgtype.ArrayCodec }

func (c textArrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if format == pgtype.BinaryFormatCode {
		switch value.(type) {
		case []string:
			return stringsBinary{elem: c.ElementType.OID}
		case []json.RawMessage:
			return rawBinary{elem: c.ElementType.OID}
		}
	}
	return c.ArrayCodec.PlanEncode(m, oid, format, value)
}

// stringsBinary writes a []string as PostgreSQL's binary array (array_recv):
// the header, one dimension with lower bound 1 (also for an empty slice, as
// pgx sends it), then each element's length and bytes. A nil slice is NULL.
type stringsBinary struct{ elem uint32 }

func (p stringsBinary) Encode(value any, buf []byte) ([]byte, error) {
	return encodeArray(p.elem, value.([]string), func(string) bool { return false }, buf)
}

// rawBinary writes a []json.RawMessage as stringsBinary writes a []string;
// a nil element is NULL, as pgx has it.
type rawBinary struct{ elem uint32 }

func (p rawBinary) Encode(value any, buf []byte) ([]byte, error) {
	return encodeArray(p.elem, value.([]json.RawMessage), func(b json.RawMessage) bool { return b == nil }, buf)
}

// encodeArray appends xs to buf as a one-dimensional binary text[] of
// element type elem, growing buf once; elements null reports are NULL.
func encodeArray[E string | json.RawMessage](elem uint32, xs []E, null func(E) bool, buf []byte) ([]byte, error) {
	if xs == nil {
		return nil, nil
	}
	if len(xs) > math.MaxInt32 {
		return nil, fmt.Errorf("pgcodec: %d elements do not fit a text[]", len(xs))
	}
	size, nulls := 20, uint32(0)
	for _, x := range xs {
		if len(x) > math.MaxInt32 {
			return nil, fmt.Errorf("pgcodec: a text[] element of %d bytes", len(x))
		}
		if null(x) {
			nulls = 1
		}
		size += 4 + len(x)
	}
	buf = slices.Grow(buf, size)
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	buf = binary.BigEndian.AppendUint32(buf, nulls)
	buf = binary.BigEndian.AppendUint32(buf, elem)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(xs)))
	buf = binary.BigEndian.AppendUint32(buf, 1) // lower bound
	for _, x := range xs {
		if null(x) {
			buf = binary.BigEndian.AppendUint32(buf, math.MaxUint32) // -1: NULL
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(x)))
		buf = append(buf, x...)
	}
	return buf, nil
}
