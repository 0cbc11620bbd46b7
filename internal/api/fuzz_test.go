package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/broker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/job"
	"github.com/llmq/llmq/internal/store"
)

// fakeStore is an in-memory api.Store for the fuzz target, which needs
// thousands of executions per second (the behaviour against Postgres is
// covered by the other tests).
type fakeStore struct {
	mu   sync.Mutex
	jobs map[job.Key]store.Record
}

func (f *fakeStore) InsertBatch(_ context.Context, jobs []job.Job) ([]store.BatchInsert, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]store.BatchInsert, len(jobs))
	for i, j := range jobs {
		j.Normalize()
		if rec, ok := f.jobs[j.Key()]; ok {
			out[i] = store.BatchInsert{Record: rec}
			continue
		}
		rec := store.Record{Job: j, Status: job.StatusQueued, CreatedAt: time.Now()}
		f.jobs[j.Key()] = rec
		out[i] = store.BatchInsert{Record: rec, Created: true}
	}
	return out, nil
}

func (f *fakeStore) Unsubmit(_ context.Context, keys []job.Key) ([]job.Key, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		delete(f.jobs, k)
	}
	return nil, nil
}
func (f *fakeStore) MarkUnenqueued(context.Context, job.Key) error { return nil }
func (f *fakeStore) MarkEnqueued(context.Context, []job.Key) error { return nil }

func (f *fakeStore) Get(_ context.Context, key job.Key) (store.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rec, ok := f.jobs[key]; ok {
		return rec, nil
	}
	return store.Record{}, store.ErrNotFound
}

func (f *fakeStore) Resubmitted(ctx context.Context, key job.Key) (store.Record, error) {
	return f.Get(ctx, key)
}

func (f *fakeStore) List(context.Context, store.ListFilter) ([]store.Record, string, error) {
	return nil, "", nil
}
func (f *fakeStore) GetMany(context.Context, string, []string) ([]store.Record, error) {
	return nil, nil
}
func (f *fakeStore) Feed(context.Context, store.FeedFilter) ([]store.Record, string, error) {
	return nil, "MDo", nil
}
func (f *fakeStore) Ahead(context.Context, job.Priority, time.Time, string) (int64, error) {
	return 0, nil
}
func (f *fakeStore) Cancel(context.Context, job.Key) (store.Record, error) {
	return store.Record{}, store.ErrNotFound
}
func (f *fakeStore) ReplayDeadLetter(context.Context, string, int64, *job.Job) (store.Replayed, error) {
	return store.Replayed{}, store.ErrNotFound
}
func (f *fakeStore) TenantBacklog(context.Context) (map[string]map[job.Priority]int64, error) {
	return map[string]map[job.Priority]int64{}, nil
}
func (f *fakeStore) DrainRate(context.Context, time.Duration) (float64, error) { return 0, nil }
func (f *fakeStore) FindDeadLetters(context.Context, store.DeadLetterFilter) ([]store.DeadLetterRow, string, error) {
	return nil, "", nil
}
func (f *fakeStore) CountDeadLetters(context.Context, store.DeadLetterFilter) (int64, error) {
	return 0, nil
}
func (f *fakeStore) AttemptLog(context.Context, job.Key) ([]store.AttemptLogEntry, error) {
	return nil, nil
}
func (f *fakeStore) GetDeadLetter(context.Context, string, int64) (store.DeadLetterRow, error) {
	return store.DeadLetterRow{}, store.ErrNotFound
}
func (f *fakeStore) TakeDeadLetter(context.Context, string, int64) (store.DeadLetterRow, error) {
	return store.DeadLetterRow{}, store.ErrNotFound
}
func (f *fakeStore) Ping(context.Context) error { return nil }
func (f *fakeStore) Usage(context.Context, store.UsageFilter) ([]store.UsageRow, error) {
	return nil, nil
}

// lastPublisher keeps only the last message (the fuzzer publishes millions).
type lastPublisher struct {
	mu   sync.Mutex
	lane job.Priority
	msg  broker.Message
	n    int
}

func (p *lastPublisher) Publish(_ context.Context, lane job.Priority, msg broker.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lane, p.msg = lane, msg
	p.n++
	return nil
}
func (p *lastPublisher) PublishIntake(ctx context.Context, lane job.Priority, msg broker.Message) error {
	return p.Publish(ctx, lane, msg)
}
func (p *lastPublisher) PublishStatus(context.Context, []byte) error { return nil }
func (p *lastPublisher) Close() error                                { return nil }

type zeroInspector struct{}

func (zeroInspector) Depth(context.Context, job.Priority) (int64, error) { return 0, nil }
func (zeroInspector) Close() error                                       { return nil }

// FuzzSubmit posts arbitrary bodies to POST /v1/jobs and, wrapped in an
// array, to POST /v1/jobs:batch. Properties: the handler never panics and
// never answers 5xx; every answer is JSON; a 400 names a stable code (and
// its field in the message); a 202 stored the job and published exactly
// one lane message, which names it (its id and the key's tenant).
//
//	go test -run x -fuzz FuzzSubmit -fuzztime 60s ./internal/api/
func FuzzSubmit(f *testing.F) {
	for _, seed := range []string{
		string(jobBody("seed-1", nil)),
		string(jobBody("", map[string]any{"priority": "high", "max_attempts": 3, "deadline": "2099-01-01T00:00:00Z"})),
		string(jobBody("x", map[string]any{"tenant": "acme", "metadata": map[string]any{"k": "v"}, "fallback_models": []string{"a", "b"}})),
		`{"id":"u","model":"m","request":{"messages":[{"role":"user","content":"\u00e9\u4e16"}],"max_tokens":1}}`,
		`{"id":"a","model":"m","request":{"messages":[{}],"max_completion_tokens":1.5}}`,
		`{"id":"a","model":"m","request":{"messages":[{}]},"tenant":"globex"}`,
		`{"id":"a","model":"m","request":{"messages":[{}]},"deadline":"2026-13-40T99:00:00Z"}`,
		`{"id":"a","model":"m","request":{"messages":[{}]}}{"x":1}`,
		`null`, `[]`, `{}`, `"str"`, "\xff\xfe",
	} {
		f.Add([]byte(seed))
	}
	fs := &fakeStore{jobs: map[job.Key]store.Record{}}
	pub := &lastPublisher{}
	srv, err := api.New(api.Config{
		Store: fs, Publisher: pub, Inspector: zeroInspector{},
		APIKeys: config.APIKeys{keyAcme: "acme"},
		Limits:  config.Limits{MaxPayloadBytes: 8 << 10},
	})
	if err != nil {
		f.Fatal(err)
	}
	h := contract.record(srv)
	post := func(t *testing.T, path string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+keyAcme)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s answered %d for %q: %s", path, rec.Code, body, rec.Body.Bytes())
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s answered non-JSON for %q: %q", path, body, rec.Body.Bytes())
		}
		return rec
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		pub.mu.Lock()
		before := pub.n
		pub.mu.Unlock()
		rec := post(t, "/v1/jobs", body)
		switch rec.Code {
		case http.StatusAccepted:
			var sub api.SubmitResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &sub); err != nil {
				t.Fatal(err)
			}
			pub.mu.Lock()
			n, msg, lane := pub.n, pub.msg, pub.lane
			pub.mu.Unlock()
			if n != before+1 {
				t.Fatalf("202 with %d publishes", n-before)
			}
			key, err := job.ReadKey(msg.Body)
			if err != nil {
				t.Fatalf("published body names no job: %v\n%s", err, msg.Body)
			}
			rec, err := fs.Get(context.Background(), key)
			if err != nil {
				t.Fatalf("published a message for a job that is not stored: %v", err)
			}
			if key.ID != sub.ID || msg.Key != sub.ID || key.Tenant != "acme" || rec.Priority != lane {
				t.Fatalf("published %+v on %s for response %+v", key, lane, sub)
			}
		case http.StatusOK:
			// An existing job (the fuzzer repeats ids).
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			var e apiErr
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatal(err)
			}
			if e.Error.Code != api.CodeInvalidJob && e.Error.Code != api.CodePayloadTooLarge {
				t.Fatalf("unexpected code %q", e.Error.Code)
			}
			if e.Error.Field != "" && !strings.Contains(e.Error.Message, e.Error.Field) {
				t.Fatalf("message %q does not name field %q", e.Error.Message, e.Error.Field)
			}
		default:
			t.Fatalf("unexpected status %d: %s", rec.Code, rec.Body.Bytes())
		}

		batch := append(append([]byte("["), body...), ']')
		rec = post(t, "/v1/jobs:batch", batch)
		if rec.Code == http.StatusAccepted {
			var resp api.BatchResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Created+resp.Existing+resp.Rejected != len(resp.Results) {
				t.Fatalf("batch counts do not add up: %+v", resp)
			}
		}
	})
}
