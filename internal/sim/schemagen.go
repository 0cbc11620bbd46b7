package sim

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// The generation half of structured output (schema.go has the subset).

// generator writes one value for a schema.
type generator struct {
	root    *schema
	rootRaw json.RawMessage
	refs    map[string]*schema // resolved $refs
	out     bytes.Buffer
}

// value writes a value for s; h decides every choice, and each child gets a
// hash of its own path so siblings differ.
func (g *generator) value(s *schema, h uint64, depth int) {
	for s.ref != "" && depth <= maxSchemaDepth {
		target := g.resolve(s.ref)
		if target == nil {
			break
		}
		s, depth = target, depth+1
	}
	switch {
	case s.constant != nil:
		g.raw(s.constant)
		return
	case len(s.enum) > 0:
		g.raw(s.enum[mix(h, "enum")%uint64(len(s.enum))])
		return
	case len(s.anyOf) > 0 && s.anyOf[0].object:
		g.value(s.anyOf[0], h, depth+1)
		return
	}
	switch s.typ() {
	case "object":
		g.out.WriteByte('{')
		props := s.props
		if depth >= maxSchemaDepth {
			props = nil
		}
		for i, p := range props {
			if i > 0 {
				g.out.WriteByte(',')
			}
			g.str(p.name)
			g.out.WriteByte(':')
			g.value(p.s, mix(h, p.name), depth+1)
		}
		g.out.WriteByte('}')
	case "array":
		g.out.WriteByte('[')
		n := 0
		if s.items != nil && depth < maxSchemaDepth {
			n = s.arrayLen()
		}
		for i := range n {
			if i > 0 {
				g.out.WriteByte(',')
			}
			g.value(s.items, mix(h, strconv.Itoa(i)), depth+1)
		}
		g.out.WriteByte(']')
	case "integer":
		g.out.WriteString(strconv.FormatInt(s.integer(h), 10))
	case "number":
		g.out.WriteString(strconv.FormatFloat(s.number(h), 'f', -1, 64))
	case "boolean":
		g.out.WriteString(strconv.FormatBool(mix(h, "bool")&1 == 1))
	case "null":
		g.out.WriteString("null")
	default:
		g.str(s.text(h))
	}
}

func (g *generator) raw(v json.RawMessage) {
	if json.Compact(&g.out, v) != nil {
		g.out.WriteString("null")
	}
}

func (g *generator) str(v string) {
	b, _ := json.Marshal(v) // a string: cannot fail
	g.out.Write(b)
}

// resolve follows a local reference: "#" or a JSON pointer into the root
// schema such as "#/$defs/Ticket"; nil when it leads nowhere.
func (g *generator) resolve(ref string) *schema {
	path, ok := strings.CutPrefix(ref, "#")
	switch {
	case !ok:
		return nil
	case path == "":
		return g.root
	}
	if s, ok := g.refs[ref]; ok {
		return s
	}
	raw := g.rootRaw
	for _, part := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return nil
		}
		if raw, ok = m[strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")]; !ok {
			return nil
		}
	}
	s := new(schema)
	if json.Unmarshal(raw, s) != nil || !s.object {
		s = nil
	}
	if g.refs == nil {
		g.refs = make(map[string]*schema)
	}
	g.refs[ref] = s
	return s
}

// typ is the node's type: the first non-null one it names, else inferred.
func (s *schema) typ() string {
	for _, t := range s.types {
		if t != "null" {
			return t
		}
	}
	switch {
	case len(s.types) > 0:
		return "null"
	case s.props != nil || s.raw["properties"] != nil:
		return "object"
	case s.items != nil:
		return "array"
	}
	return "string"
}

func (s *schema) arrayLen() int {
	n := 1
	if s.minItems != nil {
		n = max(n, *s.minItems)
	}
	if s.maxItems != nil {
		n = min(n, *s.maxItems)
	}
	return max(0, min(n, maxArrayItems))
}

// bounds is the node's inclusive range for a number, with def the default
// width when one side or both are open.
func (s *schema) bounds(def float64) (lo, hi float64, loOpen, hiOpen bool) {
	lo, hi = math.Inf(-1), math.Inf(1)
	if s.min != nil {
		lo = *s.min
	}
	if s.xmin != nil && *s.xmin >= lo {
		lo, loOpen = *s.xmin, true
	}
	if s.max != nil {
		hi = *s.max
	}
	if s.xmax != nil && *s.xmax <= hi {
		hi, hiOpen = *s.xmax, true
	}
	switch {
	case math.IsInf(lo, -1) && math.IsInf(hi, 1):
		lo, hi = 0, def
	case math.IsInf(lo, -1):
		lo = hi - def
	case math.IsInf(hi, 1):
		hi = lo + def
	}
	return lo, hi, loOpen, hiOpen
}

func (s *schema) integer(h uint64) int64 {
	lo, hi, loOpen, hiOpen := s.bounds(100)
	l, u := math.Ceil(lo), math.Floor(hi)
	if loOpen && l == lo {
		l++
	}
	if hiOpen && u == hi {
		u--
	}
	if !(u >= l) || u-l > 1<<52 {
		return int64(l) // no integer fits, or a range too wide to pick in exactly
	}
	return int64(l) + int64(mix(h, "int")%uint64(u-l+1))
}

// number is strictly inside (lo, hi) when hi > lo, so open and closed
// bounds are both met; it has three decimals when rounding keeps it inside.
func (s *schema) number(h uint64) float64 {
	lo, hi, _, _ := s.bounds(1)
	if !(hi > lo) {
		return lo
	}
	v := lo + (hi-lo)*float64(mix(h, "num")%999+1)/1000
	if r := math.Round(v*1000) / 1000; r > lo && r < hi {
		return r
	}
	return v
}

// text is "llmsim " and hex of the hash, cut or padded to the node's
// length bounds, or a sample of its format.
func (s *schema) text(h uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], mix(h, "str"))
	x := hex.EncodeToString(b[:])
	switch s.format {
	case "date-time":
		return "2025-01-01T00:00:00Z"
	case "date":
		return "2025-01-01"
	case "email":
		return "llmsim-" + x[:8] + "@example.com"
	case "uri":
		return "https://example.com/llmsim/" + x[:8]
	case "uuid":
		return x[:8] + "-" + x[8:12] + "-4" + x[13:16] + "-8" + x[1:4] + "-" + x[4:16]
	}
	t := "llmsim " + x[:8]
	if s.minLength != nil {
		for len(t) < *s.minLength {
			t += " " + x
		}
	}
	if s.maxLength != nil && len(t) > *s.maxLength {
		t = t[:max(0, *s.maxLength)]
	}
	return t
}

// mix derives a well-spread hash from h and a label (FNV-1a, then
// splitmix64's finaliser so that h % n is not biased by FNV's low bits).
func mix(h uint64, label string) uint64 {
	for i := 0; i < len(label); i++ {
		h ^= uint64(label[i])
		h *= 1099511628211
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}
