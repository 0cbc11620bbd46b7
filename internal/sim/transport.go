package sim

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
)

// ErrConnectionReset is what Transport returns for an injected connection
// reset (over a real socket the client sees the connection drop instead).
var ErrConnectionReset = errors.New("llmsim: connection reset (injected)")

// Transport returns an in-memory http.RoundTripper that calls the simulator
// directly: no sockets, so an http.Client using it works inside a
// testing/synctest bubble (latency and queuing then run on virtual time).
// The response body is buffered: a streamed reply arrives whole when the
// handler finishes. The request's context reaches the handler, so a client
// timeout ends a hanging or queued request.
func (s *Simulator) Transport() http.RoundTripper { return transport{s} }

type transport struct{ h http.Handler }

func (t transport) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	sreq := req.Clone(req.Context())
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = "127.0.0.1:0"
	if sreq.Host == "" {
		sreq.Host = req.URL.Host
	}
	w := &bufferWriter{h: http.Header{}}
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler {
				panic(r)
			}
			resp, err = nil, ErrConnectionReset
		}
	}()
	t.h.ServeHTTP(w, sreq)
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	if w.code == 0 {
		w.code = http.StatusOK
	}
	h := w.h.Clone()
	if h.Get("Content-Length") == "" {
		h.Set("Content-Length", strconv.Itoa(w.body.Len()))
	}
	return &http.Response{
		Status: strconv.Itoa(w.code) + " " + http.StatusText(w.code), StatusCode: w.code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: req,
	}, nil
}

// bufferWriter is the in-memory transport's ResponseWriter.
type bufferWriter struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (w *bufferWriter) Header() http.Header { return w.h }

func (w *bufferWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *bufferWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

// Flush implements http.Flusher (a no-op: the body is delivered whole).
func (w *bufferWriter) Flush() {}
