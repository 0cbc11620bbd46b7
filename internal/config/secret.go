package config

import "log/slog"

// Secret holds a credential. Every way of printing it — fmt, slog, JSON,
// YAML — shows "[redacted]", so a key cannot leak through a log line, an
// error message or a stored document by accident. Reveal is the only way out.
type Secret string

const redacted = "[redacted]"

// Reveal returns the credential itself, for the one place that sends it.
func (s Secret) Reveal() string { return string(s) }

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString keeps %#v from printing the value.
func (s Secret) GoString() string { return s.String() }

// LogValue keeps slog from printing the value.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText keeps encoders (JSON, YAML) from writing the value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
